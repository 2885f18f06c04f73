"""Run use cases: start, resume, cancel, and re-dispatching stalled runs.

A run is queued in the database and executed by `runs.tasks.execute_run` on a
worker (see runs.execution). One run of a thread executes at a time: runs of a
thread queue in creation order, and each finishing run dispatches the next.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Min
from django.utils import timezone

from audit import events
from audit.services import Actor, record
from runs import gates, registry
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


def dispatch(run_id) -> None:
    """Queue the Celery task once the current transaction has committed."""
    from runs.tasks import execute_run

    transaction.on_commit(lambda: execute_run.delay(str(run_id)))


def dispatch_next(thread: Thread) -> None:
    """Dispatch the thread's oldest queued run, if any."""
    next_run = (
        Run.objects.filter(thread=thread, status=Run.Status.QUEUED)
        .order_by("created_at")
        .values_list("id", flat=True)
        .first()
    )
    if next_run is not None:
        dispatch(next_run)


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
    dispatch(run.id)
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


def waiting_nodes(thread: Thread) -> list[str]:
    """The graph nodes the thread's last interrupted run stopped before."""
    last = (
        Run.objects.filter(thread=thread, status=Run.Status.INTERRUPTED)
        .order_by("-created_at")
        .values_list("next_nodes", flat=True)
        .first()
    )
    return list(last or [])


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
        ensure_nodes_exist(graph, waiting_nodes(thread), key=spec.key)
    gates.check_resume(thread=thread, graph=graph, resume=resume)
    return _queue(thread=thread, kind=Run.Kind.RESUME, actor=actor, resume_value=resume)


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


def runs_recover_stalled(*, batch_size: int = 200) -> dict[str, int]:
    """Re-dispatch runs whose worker was lost, and queued runs nobody picked up.

    A running run whose lease expired is dispatched again; the worker that
    claims it takes it over from its last checkpoint (runs.execution). A
    thread whose oldest queued run has waited longer than a lease while no run
    of it executes lost its task message; it is dispatched again. Dispatching
    twice is harmless: claiming a run is exclusive.
    """
    from runs.tasks import execute_run

    now = timezone.now()
    expired = list(
        Run.objects.filter(status=Run.Status.RUNNING, lease_until__lt=now)
        .order_by("lease_until")
        .values_list("id", flat=True)[:batch_size]
    )
    stale_before = now - timedelta(seconds=settings.GATEHOUSE_RUN_LEASE_SECONDS)
    busy_threads = Run.objects.filter(status=Run.Status.RUNNING).values("thread_id")
    stalled = list(
        Run.objects.filter(status=Run.Status.QUEUED)
        .exclude(thread_id__in=busy_threads)
        .values("thread_id")
        .annotate(oldest=Min("created_at"))
        .filter(oldest__lt=stale_before)
        .values_list("thread_id", flat=True)[:batch_size]
    )
    stalled_runs = [
        Run.objects.filter(thread_id=thread_pk, status=Run.Status.QUEUED)
        .order_by("created_at")
        .values_list("id", flat=True)
        .first()
        for thread_pk in stalled
    ]
    for run_id in [*expired, *filter(None, stalled_runs)]:
        execute_run.delay(str(run_id))
    return {"expired_leases": len(expired), "stalled_queued": len(stalled)}
