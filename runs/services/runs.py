"""Run use cases: start, resume, cancel.

A run is queued in the database, dispatched once that commits (runs.dispatch)
and executed on a worker (runs.execution). One run of a thread executes at a
time: runs of a thread queue in creation order, and each finishing run
dispatches the next.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from audit import events
from audit.redaction import digest
from audit.services import Actor, record
from runs import dispatch, gates, registry, selectors
from runs.crypto import ThreadCipher
from runs.errors import InvalidRequest, StateConflict
from runs.graphs import (
    compile_for,
    compiled,
    ensure_nodes_exist,
    spec_for,
    thread_config,
)
from runs.models import Run, Thread
from runs.signals import thread_closed


def _lock(thread: Thread) -> Thread:
    return (
        Thread.objects.select_related("tenant")
        .select_for_update(of=("self",))
        .get(pk=thread.pk, deleted_at__isnull=True)
    )


def _has_active_run(thread: Thread) -> bool:
    return Run.objects.filter(thread=thread, status__in=Run.ACTIVE).exists()


def _queue(
    *,
    thread: Thread,
    kind: str,
    actor: Actor,
    input_value: Any = None,
    resume_value: Any = None,
    checkpoint_id: str = "",
) -> Run:
    run = Run(
        tenant=thread.tenant,
        thread=thread,
        kind=kind,
        agent_version=thread.agent_version,
        checkpoint_id=checkpoint_id,
        requested_by=actor.label,
    )
    cipher = ThreadCipher.for_thread(thread)
    if input_value is not None:
        run.input = cipher.encrypt_value(input_value, row=("run-input", str(run.id)))
    if resume_value is not None:
        run.resume = cipher.encrypt_value(resume_value, row=("run-resume", str(run.id)))
    run.save()
    if thread.status != Thread.Status.RUNNING:
        thread.status = Thread.Status.RUNNING
        thread.save(update_fields=["status", "updated_at"])
    record(
        tenant=thread.tenant,
        kind=events.RUN_QUEUED,
        actor=actor,
        thread_id=thread.thread_id,
        run_id=str(run.id),
        data={
            "kind": kind,
            "agent": thread.agent_name,
            "version": thread.agent_version,
        },
    )
    dispatch.run_dispatch(run.id)
    return run


def _pin_version(thread: Thread) -> None:
    """Pin a thread's first run to the newest version that accepts new threads."""
    try:
        spec = registry.latest(thread.agent_name, for_new_threads=True)
    except registry.UnknownAgent:
        raise StateConflict(
            f"every registered version of agent {thread.agent_name} is draining: "
            "it starts no new threads",
            code="agent_draining",
        ) from None
    thread.agent_version = spec.version
    thread.save(update_fields=["agent_version", "updated_at"])


@transaction.atomic
def run_start(
    *, thread: Thread, input: dict[str, Any], actor: Actor, checkpoint_id: str = ""
) -> Run:
    thread = _lock(thread)
    if _has_active_run(thread):
        raise StateConflict(
            f"a run of thread {thread.thread_id} is queued or running; wait for it",
            code="run_in_progress",
        )
    if checkpoint_id:
        gates.require_no_open_request(thread, "a run from a checkpoint")
    if thread.status == Thread.Status.INTERRUPTED:
        raise StateConflict(
            f"thread {thread.thread_id} is waiting on an interrupt: resume it instead",
            code="thread_interrupted",
        )
    if not thread.agent_version:
        if checkpoint_id:
            raise InvalidRequest(
                "the thread has no checkpoints yet", field="checkpoint_id"
            )
        _pin_version(thread)
    spec_for(thread)  # VersionSkew when the pinned version is gone
    if checkpoint_id:
        _check_replay(thread, checkpoint_id)
    kind = Run.Kind.REPLAY if checkpoint_id else Run.Kind.START
    return _queue(
        thread=thread,
        kind=kind,
        actor=actor,
        input_value=input,
        checkpoint_id=checkpoint_id,
    )


def _check_replay(thread: Thread, checkpoint_id: str) -> None:
    """A run from a checkpoint: the checkpoint exists, and continuing from it
    passes no approval gate without a decision (runs.gates)."""
    graph = compile_for(thread)
    snapshot = graph.get_state(thread_config(thread, checkpoint_id))
    if snapshot.created_at is None:
        raise InvalidRequest(
            f"thread {thread.thread_id} has no checkpoint {checkpoint_id}",
            field="checkpoint_id",
        )
    latest = graph.get_state(thread_config(thread)).config["configurable"]
    if latest["checkpoint_id"] != checkpoint_id:
        # The latest checkpoint continues where the thread stopped: its
        # decisions were taken for exactly that. An older one would take them
        # again.
        gates.check_continuation(
            thread=thread,
            graph=graph,
            next_nodes=snapshot.next,
            doing=f"a run from checkpoint {checkpoint_id}",
        )


@transaction.atomic
def run_resume(
    *, thread: Thread, resume: Any, actor: Actor, behind_active_run: bool = False
) -> Run:
    """Resume an interrupted thread with LangGraph's resume value.

    An approval gate is resumed only with the value its request was decided
    with (runs.gates): anything else answers ApprovalRequired, whoever calls.
    `behind_active_run` is for approval decisions: a decision that arrives
    while a run of the thread still executes is queued behind it instead of
    refused, so no decision is ever lost.
    """
    thread = _lock(thread)
    active = _has_active_run(thread)
    if active and not behind_active_run:
        raise StateConflict(
            f"a run of thread {thread.thread_id} is queued or running; wait for it",
            code="run_in_progress",
        )
    if not active and thread.status != Thread.Status.INTERRUPTED:
        raise StateConflict(
            f"thread {thread.thread_id} is not interrupted (status {thread.status})",
            code="thread_not_interrupted",
        )
    spec = spec_for(thread)
    graph = compiled(spec, thread.tenant)
    if not active:
        ensure_nodes_exist(graph, selectors.waiting_nodes(thread), key=spec.key)
    gates.check_resume(thread=thread, graph=graph, resume=resume)
    return _queue(thread=thread, kind=Run.Kind.RESUME, actor=actor, resume_value=resume)


def _failed(thread: Thread) -> tuple[Thread, Run]:
    """The locked thread and its failed last run; StateConflict otherwise."""
    thread = _lock(thread)
    last = Run.objects.filter(thread=thread).order_by("-created_at").first()
    if (
        thread.status != Thread.Status.ERROR
        or last is None
        or last.status != Run.Status.FAILED
    ):
        raise StateConflict(
            f"thread {thread.thread_id} has no failed run to retry or close "
            f"(status {thread.status})",
            code="thread_not_failed",
        )
    return thread, last


@transaction.atomic
def run_retry(*, thread: Thread, actor: Actor) -> Run:
    """Run a failed thread again from its latest checkpoint: the step that
    failed runs again, with the decisions it was given (and the idempotency
    keys of its side effects), so nothing passes a gate and nothing done
    before the failure is done twice."""
    thread, _ = _failed(thread)
    spec_for(thread)  # VersionSkew when the pinned version is gone
    return _queue(thread=thread, kind=Run.Kind.RETRY, actor=actor)


@transaction.atomic
def thread_close(*, thread: Thread, actor: Actor, note: str) -> Thread:
    """Give up on a failed thread: it becomes idle, its open approval requests
    are closed (runs.signals.thread_closed), and the audit trail says who did
    it; the note, free text, only as a digest."""
    note = (note or "").strip()
    if not note:
        raise InvalidRequest("closing a failed thread needs a note", field="note")
    thread, failed = _failed(thread)
    thread.status = Thread.Status.IDLE
    thread.save(update_fields=["status", "updated_at"])
    record(
        tenant=thread.tenant,
        kind=events.THREAD_CLOSED,
        actor=actor,
        thread_id=thread.thread_id,
        run_id=str(failed.id),
        data={"note": digest(note)},
    )
    thread_closed.send(
        sender=Thread,
        thread=thread,
        actor=actor,
        reason=f"thread closed after a failed run by {actor.label}"[:200],
    )
    return thread


@transaction.atomic
def run_cancel_active(*, thread: Thread, actor: Actor, reason: str) -> int:
    """Cancel the thread's queued and running runs (its deletion, say)."""
    cancelled = 0
    for run in Run.objects.select_for_update().filter(
        thread=thread, status__in=Run.ACTIVE
    ):
        run.status = Run.Status.CANCELLED
        run.ended_at = timezone.now()
        run.lease_owner, run.lease_until = "", None
        run.save(update_fields=["status", "ended_at", "lease_owner", "lease_until"])
        record(
            tenant=thread.tenant,
            kind=events.RUN_CANCELLED,
            actor=actor,
            thread_id=thread.thread_id,
            run_id=str(run.id),
            data={"reason": reason},
        )
        cancelled += 1
    return cancelled


def run_errors_read(*, thread: Thread, runs: list[Run], actor: Actor) -> None:
    """Audit one `run.read` event for a response that decrypted the errors of
    `runs` (the failed ones among those it lists); nothing when none failed."""
    failed = [str(run.pk) for run in runs if run.error is not None]
    if failed:
        record(
            tenant=thread.tenant,
            kind=events.RUN_READ,
            actor=actor,
            thread_id=thread.thread_id,
            data={"runs": len(failed), "run_ids": failed[:100]},
        )
