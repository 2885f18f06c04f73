"""Sagas: a run that fails for good undoes what it did, newest first.

A side effect made with `compensate=fn` (runs.tools.side_effect) can be undone.
When a step fails for good (it raises: a side effect out of attempts, or a
reviewer's denial that the agent turns into an exception), the worker, still
holding the run's lease, compensates before it records the failure:

1. it marks the run `compensating` and stores its error, in one transaction
   with the `run.compensating` event, so that a worker taking the run over
   after a crash carries on undoing instead of running the graph again;
2. it undoes each completed call of the saga once, newest first. An undoing
   is a ToolCall row of its own (its key derived from the call's key,
   `compensates` pointing at the call), attempted under COMPENSATION_RETRY
   like any side effect: one that succeeded is never run again, one a crash
   left `started` runs again with the same key, which the downstream system
   deduplicates. Each success is audited (`tool.compensated`);
3. the run ends `failed` (the API's status), and `compensation` says the
   rest: `compensated`, and the thread is idle (nothing is left to do, and a
   retry would act on undone steps); or `failed`, when an undoing failed for
   good: the thread is in error, and a retry of it carries on undoing, never
   the graph.

Which calls make up a saga, and how closing a thread settles them, is
runs.sagas.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from django.db import transaction

from audit import events
from audit.services import Actor
from runs import selectors
from runs.crypto import ThreadCipher
from runs.models import LeaseLost, Run, Thread, ToolCall
from runs.sagas import saga_calls
from runs.services.threads import thread_event
from runs.tools import ActivityFailed, Ledger, RetryPolicy, import_function

SYSTEM = Actor.system("worker")
# Undoing gives up later than doing: a saga left half undone needs a person.
COMPENSATION_RETRY = RetryPolicy(attempts=5, backoff=1.0, max_backoff=15.0)
# Between a run's own error and what its compensation did, in the run's error.
SEPARATOR = "\nCompensation: "


class RecordedFailure(Exception):
    """A run's failure as recorded when its compensation began: what a worker
    that takes over a compensating run reports."""

    def __init__(self, error_type: str, text: str) -> None:
        super().__init__(text)
        self.error_type = error_type


@dataclass(frozen=True)
class Compensated:
    """How a run's compensation ended, and the error text the run records."""

    status: str  # Run.Compensation.COMPENSATED or .FAILED
    error_text: str
    undone: int


def unfinished(run: Run, thread: Thread) -> RecordedFailure | None:
    """The failure whose undoing this run must carry on with, instead of
    running the graph: its own (taken over mid-compensation), or, for a retry,
    that of the failed run whose compensation failed."""
    source: Run | None = run
    if run.compensation != Run.Compensation.COMPENSATING:
        if run.kind != Run.Kind.RETRY:
            return None
        source = (
            thread.runs.filter(status=Run.Status.FAILED, created_at__lt=run.created_at)
            .order_by("-created_at")
            .first()
        )
        if source is None or source.compensation != Run.Compensation.FAILED:
            return None
    text = (selectors.run_error_text(source) or "").partition(SEPARATOR)[0]
    return RecordedFailure(source.error_type, text)


def compensation_key(call: ToolCall) -> str:
    """The undoing's own key: derived from the call's, so it is the same on
    every attempt, whichever worker makes it."""
    material = f"gatehouse-compensation\x1f{call.idempotency_key}"
    return hashlib.sha256(material.encode()).hexdigest()


def _undo(call: ToolCall, *, thread: Thread, run: Run) -> None:
    function = import_function(call.compensation)
    cipher = ThreadCipher.for_thread(thread)
    args = cipher.decrypt_value(call.args, row=("tool-args", call.idempotency_key))
    result = cipher.decrypt_value(
        call.result, row=("tool-result", call.idempotency_key)
    )
    ledger = Ledger(
        thread=thread,
        run_id=str(run.id),
        key=compensation_key(call),
        tool=call.compensation.rpartition(":")[2][:100],
        audit={"compensated": call.tool},
        succeeded_kind=events.TOOL_COMPENSATED,
    )
    ledger.call(
        lambda key: function(args, result, key),
        retry=COMPENSATION_RETRY,
        args_digest=call.args_digest,
        compensates=call,
    )


def _failure(error: Exception) -> str:
    if isinstance(error, ActivityFailed):
        return str(error)  # names the undoing and its attempts already
    return f"undoing failed: {type(error).__name__}: {error}"


def compensate(
    *, run: Run, thread: Thread, owner: str, error_type: str, error_text: str
) -> Compensated | None:
    """Undo the saga's completed calls (see the module doc); None when there
    is nothing to undo. LeaseLost, with nothing done, if the run's lease is
    no longer this worker's."""
    calls = saga_calls(thread)
    pending = [call for call in calls if not call.undone]
    if run.compensation != Run.Compensation.COMPENSATING:
        if not pending:
            return None
        with transaction.atomic():
            cipher = ThreadCipher.for_thread(thread)
            marked = Run.held(run.pk, owner).update(
                compensation=Run.Compensation.COMPENSATING,
                error_type=error_type[:200],
                error=cipher.encrypt_value(error_text, row=("run-error", str(run.id))),
            )
            if not marked:
                raise LeaseLost(f"run {run.id} lost its lease before compensating")
            thread_event(
                thread=thread,
                kind=events.RUN_COMPENSATING,
                actor=SYSTEM,
                run=run,
                data={"error_type": error_type, "steps": len(pending)},
            )
    for call in pending:
        try:
            _undo(call, thread=thread, run=run)
        except Exception as failed:  # noqa: BLE001  reported on the run, for a person
            left = [c.tool for c in pending[pending.index(call) :]]
            return Compensated(
                status=Run.Compensation.FAILED,
                error_text=f"{error_text}{SEPARATOR}{_failure(failed)}; not undone: "
                + ", ".join(left),
                undone=len(calls) - len(left),
            )
    return Compensated(
        status=Run.Compensation.COMPENSATED,
        error_text=f"{error_text}{SEPARATOR}undone, newest first: "
        + ", ".join(call.tool for call in calls),
        undone=len(calls),
    )
