"""Replay-safe values: the clock and randomness, recorded on first use.

LangGraph runs an interrupted node again from its first line when the thread
resumes, and a node cut short by a crash runs again on the next worker. A node
that read the clock or drew a random id before the interrupt would see another
value the second time: a deadline that moves, a ticket number that changes
between the request a reviewer approved and the action taken.

`recorded(kind, draw)` gives each call a position in its step (node or task):
the n-th call of this execution. The first execution of the step draws the
value and stores it, encrypted with the thread's key, under a digest of the
step and the position (`RecordedValue`); every later execution of the same
step gets the stored value back, in the same order. A step that asks for
another kind of value at a recorded position is not deterministic: that is
refused (`NonDeterministicStep`) rather than answered with a wrong value.

Positions count per execution of a step: LangGraph gives each execution (and
each retry of it) its own `ExecutionInfo`, keyed here by the run, the task and
the attempt; `forget_run()` drops a run's counters when it ends.
"""

from __future__ import annotations

import random as _random
import secrets
import threading
import uuid
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from runs import thread_connections
from runs.context import current_step, step_key
from runs.crypto import ThreadCipher
from runs.models import RecordedValue, Thread

_positions: dict[str, dict[tuple[str, int], int]] = defaultdict(dict)
_positions_lock = threading.Lock()


class NonDeterministicStep(RuntimeError):
    """A step asked for another kind of value than its first execution did."""


def _next_position() -> int:
    context, info = current_step()
    execution = (info.task_id, info.node_attempt)
    with _positions_lock:
        counters = _positions[context.run_id]
        position = counters.get(execution, 0)
        counters[execution] = position + 1
    return position


def forget_run(run_id: str) -> None:
    """Drop the run's position counters (the run's execution has ended)."""
    with _positions_lock:
        _positions.pop(str(run_id), None)


def recorded(kind: str, draw: Callable[[], Any]) -> Any:
    """The value recorded at this position of the step, drawn the first time."""
    thread_connections.bind()  # a node may run on one of LangGraph's threads
    context, _ = current_step()
    position = _next_position()
    key = step_key("gatehouse-recorded-value", position)
    row = ("recorded-value", key)
    cipher = ThreadCipher.for_thread(
        Thread.objects.only(
            "tenant_id", "thread_id", "wrapped_data_key", "data_key_id"
        ).get(pk=context.thread_pk)
    )
    stored = (
        RecordedValue.objects.filter(thread_id=context.thread_pk, key=key)
        .values_list("kind", "value")
        .first()
    )
    if stored is None:
        value = draw()
        try:
            with transaction.atomic():
                RecordedValue.objects.create(
                    tenant_id=context.tenant_id,
                    thread_id=context.thread_pk,
                    key=key,
                    kind=kind,
                    value=cipher.encrypt_value(value, row=row),
                )
            return value
        except IntegrityError:
            # A worker that lost its lease recorded first: its value stands.
            stored = (
                RecordedValue.objects.filter(thread_id=context.thread_pk, key=key)
                .values_list("kind", "value")
                .get()
            )
    stored_kind, ciphertext = stored
    if stored_kind != kind:
        raise NonDeterministicStep(
            f"call {position + 1} of this step asked for {kind}(), but the step's "
            f"first execution asked for {stored_kind}() there; a step must draw "
            "its values in the same order every time it runs (use patched() to "
            "change a step that threads are paused in)"
        )
    return cipher.decrypt_value(ciphertext, row=row)


def now() -> datetime:
    """The current time (UTC), as the step's first execution saw it."""
    return recorded("now", timezone.now)


def random() -> float:
    """A float in [0, 1), the same each time the step runs."""
    return recorded("random", _random.random)


def uuid4() -> uuid.UUID:
    """A random UUID, the same each time the step runs."""
    return recorded("uuid4", uuid.uuid4)


def Random() -> _random.Random:  # noqa: N802  (mirrors random.Random)
    """A `random.Random` seeded with a recorded seed: it draws the same
    sequence each time the step runs."""
    return _random.Random(recorded("seed", lambda: secrets.randbits(64)))
