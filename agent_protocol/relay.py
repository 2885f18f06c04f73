"""Relaying a run's stream events (runs.streaming) to a client.

Both run in the web process's event loop, holding no database connection
while they wait (the request's thread stays reserved, idle, until the answer
ends: docs/scaling.md): `sse()` as Server-Sent Events in LangGraph's
framing (`event:`, `data:`, `id:`), `wait()` as one JSON body once the run has
ended (`runs.wait`, `runs.join`), with a newline now and then to keep the
connection open while the run goes on.

Both follow the run as `runs.streaming.until_stopped` does (the REST run
detail's `?wait=` waits the same way): they wake on the worker's events, and
when none has come for a while they look the run up; one that ended without
an `end` event in the log (its events expired, or its worker lost the
thread) is ended from the database instead.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field

from asgiref.sync import sync_to_async

from agent_protocol import shapes
from audit.services import Actor
from runs import services, streaming
from runs.crypto import ThreadCipher
from runs.errors import StateConflict
from runs.graphs import compile_for, thread_config
from runs.models import Run, Thread

logger = logging.getLogger(__name__)

# Seconds without an event before the run is looked up (and a keep-alive sent).
IDLE = 5.0
KEEP_ALIVE = b": keep-alive\n\n"


def frame(event: str, data: bytes, event_id: streaming.EventId | None = None) -> bytes:
    lines = [b"event: " + event.encode(), b"data: " + data]
    if event_id is not None:
        lines.append(b"id: " + str(event_id).encode())
    return b"\n".join(lines) + b"\n\n"


@dataclass(frozen=True)
class Target:
    """The run a client follows, and who follows it (for the audit trail)."""

    run_id: str
    thread_pk: int
    actor: Actor
    # The run as the view read it: with its thread (and the thread's tenant)
    # loaded, `_open` reads neither again.
    run: Run | None = field(default=None, compare=False, repr=False)

    @classmethod
    def of(cls, run: Run, actor: Actor) -> Target:
        return cls(run_id=str(run.id), thread_pk=run.thread_id, actor=actor, run=run)


def _loaded(run: Run | None) -> bool:
    return (
        run is not None
        and Run.thread.is_cached(run)
        and Thread.tenant.is_cached(run.thread)
    )


def _open(target: Target, how: str) -> ThreadCipher:
    """The thread's cipher, with the read recorded in the audit trail."""
    run = target.run
    if not _loaded(run):
        run = Run.objects.select_related("thread__tenant").get(pk=target.run_id)
    services.run_output_read(run=run, thread=run.thread, actor=target.actor, how=how)
    cipher = ThreadCipher.for_thread(run.thread)
    streaming.release_connection()
    return cipher


def _outcome_of(run: Run) -> dict:
    """The outcome of a run found stopped while no `end` event is to be had
    (expired, or lost with its worker)."""
    thread: Thread = run.thread
    values = None
    if thread.agent_version and thread.deleted_at is None:
        values = compile_for(thread).get_state(thread_config(thread)).values
    error = None
    if run.status == Run.Status.FAILED:
        error = {"error": run.error_type, "message": "the run failed"}
    return streaming.outcome(status=run.status, values=values, error=error)


def _cancel(target: Target) -> None:
    run = Run.objects.select_related("thread__tenant").get(pk=target.run_id)
    if run.is_active:
        try:
            services.run_cancel(
                thread=run.thread,
                run=run,
                actor=target.actor,
                action=Run.CancelAction.INTERRUPT,
            )
        except StateConflict:
            pass  # ended meanwhile, or it carries a reviewer's decision


async def _outcomes(
    target: Target, cipher: ThreadCipher, after: streaming.EventId
) -> AsyncIterator[streaming.StreamEvent | dict | None]:
    """The run's events; then its outcome (a dict) if the log had no `end`;
    None for each idle pause."""
    async for item in streaming.until_stopped(
        run_id=target.run_id, cipher=cipher, after=after, idle=IDLE
    ):
        if isinstance(item, Run):
            yield await sync_to_async(_outcome_of)(item)
        else:
            yield item


def _end_frames(outcome: dict, event_id: streaming.EventId | None) -> list[bytes]:
    frames = []
    if outcome.get("error"):
        frames.append(frame("error", json.dumps(outcome["error"]).encode(), event_id))
    frames.append(frame("end", b"null", event_id))
    return frames


async def sse(
    target: Target,
    *,
    modes: Iterable[str] | None,
    after: streaming.EventId = streaming.START,
    live: bool = False,
    cancel_on_disconnect: bool = False,
) -> AsyncIterator[bytes]:
    """The run's events as SSE frames, from after `after` (or, `live`, from
    now on), filtered to `modes` (None: all it publishes), then `end`."""
    wanted = None if modes is None else {streaming.METADATA, *modes}
    try:
        cipher = await sync_to_async(_open)(target, "stream")
        if live:
            after = await streaming.live_start(target.run_id)
        async for item in _outcomes(target, cipher, after):
            if item is None:
                yield KEEP_ALIVE
            elif isinstance(item, dict):
                for chunk in _end_frames(item, None):
                    yield chunk
            elif item.name == streaming.END:
                for chunk in _end_frames(json.loads(item.data), item.id):
                    yield chunk
            elif wanted is None or item.name.split("|", 1)[0] in wanted:
                yield frame(item.name, item.data, item.id)
    except asyncio.CancelledError:
        # The client went away.
        if cancel_on_disconnect:
            await sync_to_async(_cancel)(target)
        raise


async def wait(target: Target, *, how: str) -> AsyncIterator[bytes]:
    """A newline per idle pause, then the JSON that `runs.wait` answers."""
    cipher = await sync_to_async(_open)(target, how)
    after = await streaming.live_start(target.run_id)
    async for item in _outcomes(target, cipher, after):
        if item is None:
            yield b"\n"
        elif isinstance(item, dict):
            yield json.dumps(shapes.wait_output(item)).encode()
        elif item.name == streaming.END:
            yield json.dumps(shapes.wait_output(json.loads(item.data))).encode()
