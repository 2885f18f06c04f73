"""Executing one run on a worker: claim it, hold its lease, run the graph, record.

At-least-once: a run whose worker died (SIGKILL, a deploy) keeps its status
`running` until its lease runs out; then `runs.dispatch.runs_recover_stalled`
dispatches it
again and the next worker takes it over. The graph continues from the run's
last checkpoint; side effects inside it go through `runs.tools.side_effect`,
so a repeated step does not repeat what already happened.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import close_old_connections, connection, transaction
from django.utils import timezone
from langgraph.types import Command

from audit import events
from audit.services import Actor, record
from runs import dispatch, replay, selectors
from runs.context import RunContext
from runs.crypto import ThreadCipher
from runs.errors import VersionSkew
from runs.gates import gate_nodes_of
from runs.graphs import compiled, ensure_nodes_exist, spec_for, thread_config
from runs.models import Checkpoint, Run, Thread
from runs.signals import InterruptRejected, run_interrupted

logger = logging.getLogger(__name__)
SYSTEM = Actor.system("worker")


def new_lease_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _lease_length() -> timedelta:
    return timedelta(seconds=settings.GATEHOUSE_RUN_LEASE_SECONDS)


@dataclass
class Outcome:
    interrupts: list[Any] = field(default_factory=list)
    next_nodes: list[str] = field(default_factory=list)
    gate_nodes: list[str] = field(default_factory=list)
    error: BaseException | None = None


class Heartbeat(threading.Thread):
    """Renews the run's lease every third of its length while the graph runs."""

    def __init__(self, run_id, owner: str) -> None:
        super().__init__(name=f"lease-{run_id}", daemon=True)
        self.run_id, self.owner = run_id, owner
        self.stopped = threading.Event()

    def run(self) -> None:
        interval = settings.GATEHOUSE_RUN_LEASE_SECONDS / 3
        try:
            while not self.stopped.wait(interval):
                now = timezone.now()
                renewed = Run.objects.filter(
                    pk=self.run_id, lease_owner=self.owner, status=Run.Status.RUNNING
                ).update(lease_until=now + _lease_length(), heartbeat_at=now)
                if not renewed:
                    logger.warning("run %s: lease lost to another worker", self.run_id)
                    return
        finally:
            connection.close()

    def stop(self) -> None:
        self.stopped.set()
        self.join(timeout=5)


def _claim(run_id: str, owner: str) -> tuple[Run, Thread] | None:
    """Take the run if it is this worker's to execute; None otherwise."""
    with transaction.atomic():
        thread_pk = (
            Run.objects.filter(pk=run_id).values_list("thread_id", flat=True).first()
        )
        if thread_pk is None:
            return None
        # Lock order everywhere: thread, then its runs.
        thread = (
            Thread.objects.select_related("tenant")
            .select_for_update(of=("self",))
            .filter(pk=thread_pk, deleted_at__isnull=True)
            .first()
        )
        if thread is None:
            return None
        run = Run.objects.select_for_update().get(pk=run_id)
        now = timezone.now()
        recovered_from = ""
        if run.status == Run.Status.RUNNING:
            if run.lease_until and run.lease_until > now:
                return None  # another worker holds it: a duplicate delivery
            recovered_from = run.lease_owner
        elif run.status == Run.Status.QUEUED:
            ahead = (
                Run.objects.filter(thread=thread, status__in=Run.ACTIVE)
                .exclude(pk=run.pk)
                .filter(created_at__lte=run.created_at)
            )
            if (
                ahead.exists()
                or Run.objects.filter(thread=thread, status=Run.Status.RUNNING).exists()
            ):
                return None  # runs of a thread execute one at a time, in order
        else:
            return None  # finished or cancelled already
        run.status = Run.Status.RUNNING
        run.lease_owner = owner
        run.lease_until = now + _lease_length()
        run.heartbeat_at = now
        run.attempts += 1
        run.started_at = run.started_at or now
        run.save(
            update_fields=[
                "status",
                "lease_owner",
                "lease_until",
                "heartbeat_at",
                "attempts",
                "started_at",
            ]
        )
        if thread.status != Thread.Status.RUNNING:
            thread.status = Thread.Status.RUNNING
            thread.save(update_fields=["status", "updated_at"])
        if recovered_from:
            record(
                tenant=thread.tenant,
                kind=events.RUN_RECOVERED,
                actor=SYSTEM,
                thread_id=thread.thread_id,
                run_id=str(run.id),
                data={"worker": recovered_from},
            )
        record(
            tenant=thread.tenant,
            kind=events.RUN_STARTED,
            actor=SYSTEM,
            thread_id=thread.thread_id,
            run_id=str(run.id),
            data={"worker": owner, "attempt": run.attempts},
        )
        return run, thread


def _graph_input(run: Run, thread: Thread, cipher: ThreadCipher) -> tuple[Any, dict]:
    """What to invoke the graph with: the run's input, or nothing to continue.

    A run that already wrote a checkpoint (an earlier attempt got that far)
    continues from the thread's latest checkpoint instead of starting over.
    """
    progressed = Checkpoint.objects.filter(thread=thread, run_id=str(run.id)).exists()
    config = thread_config(thread, None if progressed else run.checkpoint_id or None)
    config["run_id"] = run.id
    # Copied into every checkpoint's metadata (encrypted): how a later attempt
    # knows this run got that far, and what delete_for_runs keys on.
    config["metadata"] = {"run_id": str(run.id)}
    if progressed or run.kind == Run.Kind.RETRY:
        # A retry continues the thread's latest checkpoint, the failed step
        # first, as the failed run would have.
        return None, config
    if run.kind == Run.Kind.RESUME:
        resume = cipher.decrypt_value(run.resume, row=("run-resume", str(run.id)))
        return Command(resume=resume), config
    return cipher.decrypt_value(run.input, row=("run-input", str(run.id))), config


def _invoke(run: Run, thread: Thread) -> Outcome:
    spec = spec_for(thread, run.agent_version)
    graph = compiled(spec, thread.tenant)
    if run.kind == Run.Kind.RESUME:
        # The nodes recorded when the thread stopped: a graph that lost one of
        # them would silently resume nothing.
        ensure_nodes_exist(graph, selectors.waiting_nodes(thread), key=spec.key)
    cipher = ThreadCipher.for_thread(thread)
    graph_input, config = _graph_input(run, thread, cipher)
    context = RunContext(
        tenant_id=thread.tenant_id,
        thread_pk=thread.pk,
        run_id=str(run.id),
    )
    graph.invoke(graph_input, config, context=context, durability="sync")
    state = graph.get_state(thread_config(thread))
    return Outcome(
        interrupts=list(state.interrupts),
        next_nodes=list(state.next),
        gate_nodes=gate_nodes_of(state),
    )


def _error_text(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"[:2000]


def _finish(run_id: str, owner: str, outcome: Outcome) -> None:
    with transaction.atomic():
        thread = (
            Thread.objects.select_related("tenant")
            .select_for_update(of=("self",))
            .filter(runs__pk=run_id, deleted_at__isnull=True)
            .first()
        )
        if thread is None:
            return  # deleted while running: nothing left to record
        run = Run.objects.select_for_update().get(pk=run_id)
        if run.lease_owner != owner or run.status != Run.Status.RUNNING:
            logger.warning(
                "run %s: finished after losing its lease; not recorded", run_id
            )
            return
        error = outcome.error
        if error is None and outcome.interrupts:
            try:
                with transaction.atomic():
                    run.status = Run.Status.INTERRUPTED
                    run.next_nodes = outcome.next_nodes
                    run_interrupted.send(
                        sender=Run, run=run, interrupts=outcome.interrupts
                    )
            except InterruptRejected as rejected:
                error = rejected
        cipher = ThreadCipher.for_thread(thread)
        if error is not None:
            run.status = Run.Status.FAILED
            run.error_type = type(error).__name__[:200]
            run.error = cipher.encrypt_value(
                _error_text(error), row=("run-error", str(run.id))
            )
            thread.status = Thread.Status.ERROR
            kind, data = events.RUN_FAILED, {"error_type": run.error_type}
        elif outcome.interrupts:
            thread.status = Thread.Status.INTERRUPTED
            thread.gated_nodes = sorted(
                set(thread.gated_nodes) | set(outcome.gate_nodes)
            )
            kind, data = events.RUN_INTERRUPTED, {"count": len(outcome.interrupts)}
        else:
            run.status = Run.Status.SUCCEEDED
            thread.status = Thread.Status.IDLE
            kind, data = events.RUN_SUCCEEDED, {}
        run.ended_at = timezone.now()
        run.lease_owner, run.lease_until = "", None
        run.save()
        thread.save(update_fields=["status", "gated_nodes", "updated_at"])
        record(
            tenant=thread.tenant,
            kind=kind,
            actor=SYSTEM,
            thread_id=thread.thread_id,
            run_id=str(run.id),
            data=data,
        )
        dispatch.thread_dispatch_next(thread)


def execute(run_id: str) -> None:
    """Execute a run if it is this worker's to execute (see _claim)."""
    close_old_connections()
    owner = new_lease_owner()
    claimed = _claim(run_id, owner)
    if claimed is None:
        return
    run, thread = claimed
    heartbeat = Heartbeat(run.id, owner)
    heartbeat.start()
    try:
        outcome = _invoke(run, thread)
    except VersionSkew as skew:
        outcome = Outcome(error=skew)
    except Exception as exc:  # the agent's own failure ends the run, not the worker
        logger.info("run %s failed: %s", run_id, type(exc).__name__)
        outcome = Outcome(error=exc)
    finally:
        heartbeat.stop()
        replay.forget_run(run_id)
    _finish(run_id, owner, outcome)
