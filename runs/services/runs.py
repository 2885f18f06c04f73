"""Run use cases: start, resume, cancel.

A run is queued in the database, dispatched once that commits (runs.dispatch)
and executed on a worker (runs.execution). One run of a thread executes at a
time: runs of a thread queue in creation order, and each finishing run
dispatches the next.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction
from django.db.models import Exists, JSONField, OuterRef, Subquery
from django.utils import timezone
from langgraph.pregel import Pregel

from audit import events
from audit.redaction import digest
from audit.services import Actor, record
from runs import (
    dispatch,
    gates,
    patches,
    registry,
    sagas,
    selectors,
    streaming,
    wakeups,
)
from runs.crypto import ThreadCipher
from runs.errors import InvalidRequest, StateConflict
from runs.fixed_queries import FixedQuery
from runs.graphs import (
    compile_for,
    compiled,
    ensure_nodes_exist,
    spec_for,
    thread_config,
)
from runs.models import Checkpoint, Run, Tenant, Thread
from runs.services.threads import (
    latest_continuation_check,
    run_metadata,
    thread_event,
)
from runs.signals import thread_closed

# The thread's row locked FOR NO KEY UPDATE OF the thread alone, read after
# the lock with its tenant, in no order (Thread's default ordering joins the
# tenant, whose row must not be locked: approvals.services.lifecycle says
# why). On every run start, resume and decision: compiled once per process
# (runs.fixed_queries).
_LOCKED_THREAD = FixedQuery(
    lambda pk: (
        Thread.objects.select_related("tenant")
        .select_for_update(of=("self",), no_key=True)
        .filter(pk=pk)
        .order_by()
    ),
    -1,
)


def thread_locked(pk: int) -> Thread:
    """The thread `pk`, locked in the caller's transaction and current, with
    its tenant; a deleted thread's tombstone too (the caller says what that
    means)."""
    rows = _LOCKED_THREAD(pk)
    if not rows:
        raise Thread.DoesNotExist(f"no thread {pk}")
    return rows[0]


# The tenant's live thread by its client's id, locked as _LOCKED_THREAD, in
# one statement where finding it and then locking it took two (a request
# that changes a thread: runs.api.views). A thread deleted while the
# statement waited for the lock is not returned: Postgres checks the row
# locked against the filter again.
_LIVE_THREAD_LOCKED = FixedQuery(
    lambda tenant_pk, thread_id: (
        Thread.objects.for_tenant(tenant_pk)
        .select_related("tenant")
        .select_for_update(of=("self",), no_key=True)
        .filter(thread_id=thread_id)
        .order_by()
    ),
    -1,
    "\x00sample thread id",
)


def live_thread_locked(tenant: Tenant, thread_id: str) -> Thread | None:
    """The tenant's live thread `thread_id`, locked in the caller's
    transaction and current, with its tenant; None if there is none."""
    rows = _LIVE_THREAD_LOCKED(tenant.pk, str(thread_id))
    return rows[0] if rows else None


def _lock(thread: Thread) -> Thread:
    locked = thread_locked(thread.pk)
    if locked.deleted_at is not None:
        raise Thread.DoesNotExist(f"thread {thread.thread_id} was deleted")
    return locked


# What a resume checks of the thread's runs, in one statement compiled once
# per process (runs.fixed_queries): whether one is queued or running
# (`active`), and the nodes the last interrupted one stopped before
# (`waiting_nodes`). The thread's row is only the frame: nothing of it is read.
_RESUME_CONTEXT = FixedQuery(
    lambda pk: (
        Thread.objects.filter(pk=pk)
        .only("pk")
        .annotate(
            active=Exists(
                Run.objects.filter(thread_id=OuterRef("pk"), status__in=Run.ACTIVE)
            ),
            waiting_nodes=Subquery(
                selectors.waiting_nodes_query(OuterRef("pk")),
                output_field=JSONField(),
            ),
        )
        .order_by()
    ),
    -1,
)


# LangGraph's stream modes a run may publish (runs.streaming).
STREAM_MODES = frozenset(
    {"values", "updates", "messages", "custom", "debug", "tasks", "checkpoints"}
)


def _check_stream_modes(stream_modes) -> list[str]:
    unknown = sorted(set(stream_modes) - STREAM_MODES)
    if unknown:
        raise InvalidRequest(
            f"unknown stream modes {', '.join(unknown)}; "
            f"known: {', '.join(sorted(STREAM_MODES))}",
            field="stream_mode",
        )
    return sorted(set(stream_modes))


def _queue(
    *,
    thread: Thread,
    kind: str,
    actor: Actor,
    input_value: Any = None,
    resume_value: Any = None,
    checkpoint_id: str = "",
    options: RunOptions | None = None,
    thread_fields: list[str] | None = None,
) -> Run:
    """Queue the run; the thread saved once, running, with `thread_fields`
    the caller changed."""
    options = options or RunOptions()
    run = Run(
        tenant=thread.tenant,
        thread=thread,
        kind=kind,
        agent_version=thread.agent_version,
        checkpoint_id=checkpoint_id,
        requested_by=actor.label,
        metadata=run_metadata(thread, options.metadata),
        multitask_strategy=options.multitask,
        stream_modes=_check_stream_modes(options.stream_modes),
        stream_subgraphs=options.stream_subgraphs,
    )
    cipher = ThreadCipher.for_thread(thread)
    if input_value is not None:
        run.input = cipher.encrypt_value(input_value, row=("run-input", str(run.id)))
    if resume_value is not None:
        run.resume = cipher.encrypt_value(resume_value, row=("run-resume", str(run.id)))
    changed = list(thread_fields or [])
    if thread.status != Thread.Status.RUNNING:
        thread.status = Thread.Status.RUNNING
        changed.append("status")
    thread_event(
        thread=thread,
        kind=events.RUN_QUEUED,
        actor=actor,
        run=run,
        data={
            "kind": kind,
            "agent": thread.agent_name,
            "version": thread.agent_version,
        },
        # The run's INSERT and the thread's UPDATE in the event's statement:
        # one round trip.
        inserts=[run],
        saves=[(thread, [*changed, "updated_at"])] if changed else (),
    )
    dispatch.run_dispatch(run.id)
    return run


@dataclass(frozen=True)
class RunOptions:
    """How a run is asked for, beyond its input: what it publishes while it
    runs (runs.streaming), its metadata, and what it does when the thread
    already has an active run (`multitask`)."""

    stream_modes: tuple[str, ...] = ()
    stream_subgraphs: bool = False
    metadata: dict[str, Any] = field(default_factory=dict)
    multitask: str = Run.Multitask.REJECT


def _bind_agent(thread: Thread, agent: str | None, version: str | None) -> None:
    """Bind a thread that has no agent yet; refuse another agent or version."""
    if not thread.agent_name:
        if not agent:
            raise InvalidRequest(
                f"thread {thread.thread_id} has no agent yet: name one",
                field="agent",
            )
        try:
            registry.latest(agent)
        except registry.UnknownAgent:
            raise InvalidRequest(
                f"no agent {agent!r} is registered", field="agent"
            ) from None
        thread.agent_name = agent
        thread.save(update_fields=["agent_name", "updated_at"])
    elif agent and agent != thread.agent_name:
        raise StateConflict(
            f"thread {thread.thread_id} belongs to agent {thread.agent_name}, "
            f"not {agent}",
            code="agent_mismatch",
        )
    if version and thread.agent_version and version != thread.agent_version:
        raise StateConflict(
            f"thread {thread.thread_id} is pinned to "
            f"{thread.agent_name}@{thread.agent_version}, not version {version}",
            code="version_mismatch",
        )


def _pin_version(thread: Thread, version: str | None = None) -> None:
    """Pin a thread's first run to `version`, or to the newest version that
    accepts new threads."""
    try:
        spec = registry.latest(thread.agent_name, for_new_threads=True)
        if version:
            spec = registry.get(thread.agent_name, version)
    except registry.UnknownAgent:
        raise StateConflict(
            f"every registered version of agent {thread.agent_name} is draining: "
            "it starts no new threads",
            code="agent_draining",
        ) from None
    if spec.draining:
        raise StateConflict(
            f"agent {spec.key} is draining: it starts no new threads",
            code="agent_draining",
        )
    thread.agent_version = spec.version
    thread.patches = sorted(spec.patches | spec.retired_patches)
    # Saved with the run it pins (`_queue`, thread_fields).


# The thread's queued and running runs, locked, oldest first: on every run
# start (most find none), compiled once per process (runs.fixed_queries).
_ACTIVE_RUNS_LOCKED = FixedQuery(
    lambda pk: (
        Run.objects.select_for_update(no_key=True)
        .filter(thread_id=pk, status__in=Run.ACTIVE)
        .order_by("created_at")
    ),
    -1,
)


def _make_room(thread: Thread, *, multitask: str, actor: Actor) -> bool:
    """Apply the multitask strategy to the thread's active runs, if any;
    whether there were any. Call it with the thread locked: no run of it
    starts or ends meanwhile."""
    active = _ACTIVE_RUNS_LOCKED(thread.pk)
    if not active:
        return False
    if multitask == Run.Multitask.ENQUEUE:
        return True
    if multitask == Run.Multitask.REJECT:
        raise StateConflict(
            f"a run of thread {thread.thread_id} is queued or running; wait for it",
            code="run_in_progress",
        )
    _refuse_cancelling_a_decision(thread, active, action=multitask)
    for run in active:
        _cancel(run=run, thread=thread, actor=actor, action=multitask)
    return True


def _decision_resumes(thread: Thread, runs) -> list[Run]:
    """Those of `runs` (active runs of the thread) that carry a reviewer's
    decision to the agent: resumes whose value answers an approval gate with
    its settled request's value (the only value runs.gates lets resume a
    gate). Read only for resumes, on the rare paths that would cancel one."""
    resumes = [run for run in runs if run.kind == Run.Kind.RESUME and run.resume]
    if not resumes:
        return []
    cipher = ThreadCipher.for_thread(thread)
    keeper = gates.gatekeeper()
    carrying = []
    for run in resumes:
        value = cipher.decrypt_value(run.resume, row=("run-resume", str(run.id)))
        if (
            isinstance(value, Mapping)
            and value
            and keeper.decided_resumes(thread, [str(key) for key in value])
        ):
            carrying.append(run)
    return carrying


def _refuse_cancelling_a_decision(thread: Thread, runs, *, action: str) -> None:
    """Nobody but the decision decides what happens at a gate: a run that
    carries a decision to the agent is not cancelled before the agent has it,
    whether by another run's multitask strategy or by a cancel (the request
    would read approved or denied while the agent never saw it), nor rolled
    back after (its checkpoints deleted, the gate would wait again on a
    request already settled). The agent has it once the run has written a
    checkpoint: the first a resume writes is after the gate's step. Not when
    it is merely running: a worker lost before that step leaves a cancelled
    run recorded cancelled by the next claim, which never runs the graph; and
    a run is stopped between stream parts, which may come before that step.
    From then on `interrupt` stops it like any run: stopping an agent is
    always possible. The thread's deletion stops it in any case (retention,
    run_cancel_active)."""
    carrying = [
        run
        for run in _decision_resumes(thread, runs)
        if action == Run.CancelAction.ROLLBACK or not _has_checkpointed(thread, run)
    ]
    if carrying:
        raise StateConflict(
            f"thread {thread.thread_id} is resuming a reviewer's decision (run "
            f"{carrying[0].id}) that has not reached the agent yet; wait for "
            "that run to take its first step (then it can be interrupted, not "
            "rolled back) or to end",
            code="decision_resuming",
        )


def _has_checkpointed(thread: Thread, run: Run) -> bool:
    """Whether the run has written a checkpoint of the thread's graph (the
    root namespace: a subgraph's is written before its parent's step ends)."""
    return Checkpoint.objects.filter(
        thread=thread, checkpoint_ns="", run_id=str(run.id)
    ).exists()


@transaction.atomic
def run_start(
    *,
    thread: Thread,
    input: dict[str, Any] | None,
    actor: Actor,
    checkpoint_id: str = "",
    agent: str | None = None,
    version: str | None = None,
    options: RunOptions | None = None,
) -> Run:
    """Queue a run of the thread's agent with `input`.

    A thread without an agent yet is bound to `agent` (pinned to `version`,
    or to the newest one that accepts new threads); a thread of another agent
    or pinned to another version is refused. While a run of the thread is
    active, `options.multitask` decides: refuse (409), queue behind it, or
    cancel it first (interrupt: keep its checkpoints; rollback: delete them).
    """
    return run_start_locked(
        thread=_lock(thread),
        input=input,
        actor=actor,
        checkpoint_id=checkpoint_id,
        agent=agent,
        version=version,
        options=options,
    )


def run_start_locked(
    *,
    thread: Thread,
    input: dict[str, Any] | None,
    actor: Actor,
    checkpoint_id: str = "",
    agent: str | None = None,
    version: str | None = None,
    options: RunOptions | None = None,
) -> Run:
    """`run_start` in the caller's transaction, which holds the thread's row
    locked (FOR NO KEY UPDATE) and read it, live, with its tenant, after the
    lock (live_thread_locked): no second read of the row, no savepoint of
    its own."""
    options = options or RunOptions()
    _bind_agent(thread, agent, version)
    if checkpoint_id:
        gates.require_no_open_request(thread, "a run from a checkpoint")
    active_before = _make_room(thread, multitask=options.multitask, actor=actor)
    if thread.status == Thread.Status.INTERRUPTED and not active_before:
        raise StateConflict(
            f"thread {thread.thread_id} is waiting on an interrupt: resume it instead",
            code="thread_interrupted",
        )
    if not thread.agent_version:
        if checkpoint_id:
            raise InvalidRequest(
                "the thread has no checkpoints yet", field="checkpoint_id"
            )
        _pin_version(thread, version)
        pinned = ["agent_version", "patches"]
    else:
        pinned = []
    # VersionSkew when the pinned version is gone, or cannot run the thread.
    patches.ensure_fits(thread, spec_for(thread))
    if checkpoint_id:
        _check_replay(thread, checkpoint_id, continuing=input is None)
    elif input is None:
        latest_continuation_check(
            thread,
            doing="a run without input (a failed thread is run again by a "
            "compliance officer's Retry)",
        )
    kind = Run.Kind.REPLAY if checkpoint_id else Run.Kind.START
    return _queue(
        thread=thread,
        kind=kind,
        actor=actor,
        input_value=input,
        checkpoint_id=checkpoint_id,
        options=options,
        thread_fields=pinned,
    )


def _check_replay(thread: Thread, checkpoint_id: str, *, continuing: bool) -> None:
    """A run from a checkpoint: the checkpoint exists, and continuing from it
    passes no approval gate without a decision (runs.gates). From the latest
    one without input (`continuing`), it is the run without input of
    `run_start`: the compliance officer's Retry past a gate, refused."""
    graph = compile_for(thread)
    snapshot = graph.get_state(thread_config(thread, checkpoint_id))
    if snapshot.created_at is None:
        raise InvalidRequest(
            f"thread {thread.thread_id} has no checkpoint {checkpoint_id}",
            field="checkpoint_id",
        )
    latest = graph.get_state(thread_config(thread)).config["configurable"]
    if latest["checkpoint_id"] != checkpoint_id or continuing:
        # An older checkpoint would take its decisions again. The latest one
        # without input continues where the thread stopped: past a gate, that
        # is a Retry (a compliance officer's), not a caller's run.
        gates.check_continuation(
            thread=thread,
            graph=graph,
            next_nodes=snapshot.next,
            doing=f"a run from checkpoint {checkpoint_id}",
        )


@transaction.atomic
def run_resume(
    *,
    thread: Thread,
    resume: Any,
    actor: Actor,
    behind_active_run: bool = False,
    options: RunOptions | None = None,
    agent: str | None = None,
    version: str | None = None,
    settled: Mapping[str, Any] | None = None,
) -> Run:
    """Resume an interrupted thread with LangGraph's resume value.

    An approval gate is resumed only with the value its request was decided
    with (runs.gates): anything else answers ApprovalRequired, whoever calls.
    `behind_active_run` is for approval decisions: a decision that arrives
    while a run of the thread still executes is queued behind it instead of
    refused, so no decision is ever lost. `agent` and `version`, when given,
    must be the thread's. `settled`: see run_resume_locked.
    """
    return run_resume_locked(
        thread=_lock(thread),
        resume=resume,
        actor=actor,
        behind_active_run=behind_active_run,
        options=options,
        agent=agent,
        version=version,
        settled=settled,
    )


def _resume_graph(thread: Thread) -> Pregel | None:
    """The graph of the thread's agent version; None if that version is not
    registered (run_resume_locked says so after its other refusals)."""
    try:
        spec = registry.get(thread.agent_name, thread.agent_version)
    except registry.UnknownAgent:
        return None
    return compiled(spec, thread.tenant)


def run_resume_locked(
    *,
    thread: Thread,
    resume: Any,
    actor: Actor,
    behind_active_run: bool = False,
    options: RunOptions | None = None,
    agent: str | None = None,
    version: str | None = None,
    settled: Mapping[str, Any] | None = None,
) -> Run:
    """`run_resume` in the caller's transaction, which holds the thread's row
    locked (FOR NO KEY UPDATE) and read it, with its tenant, after the lock:
    no second read of the row, no savepoint of its own. A caller that must
    go on after a refusal puts a savepoint around it. `settled`: the resume
    values of approval requests the caller settled in this transaction
    (runs.gates.check_resume)."""
    if thread.deleted_at is not None:
        raise Thread.DoesNotExist(f"thread {thread.thread_id} was deleted")
    _bind_agent(thread, agent, version)
    graph = _resume_graph(thread)
    saver = None
    if graph is None:
        (runs,) = _RESUME_CONTEXT(thread.pk)
    else:
        # The thread's runs and its latest checkpoint (the gate's check reads
        # its pending interrupts) in one round trip, where they were two.
        rows, saver = graph.checkpointer.latest_after(
            thread.thread_id, _RESUME_CONTEXT.statement(thread.pk)
        )
        (runs,) = _RESUME_CONTEXT.objects(rows)
    active = runs.active
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
    patches.ensure_fits(thread, spec)
    if graph is None:
        graph = compiled(spec, thread.tenant)
    if not active:
        ensure_nodes_exist(graph, list(runs.waiting_nodes or []), key=spec.key)
    gates.check_resume(
        thread=thread, graph=graph, resume=resume, settled=settled, saver=saver
    )
    return _queue(
        thread=thread,
        kind=Run.Kind.RESUME,
        actor=actor,
        resume_value=resume,
        options=options,
    )


def _thread_status_after(thread: Thread, cancelled: Run) -> str:
    """What a thread is once `cancelled` stopped: busy with another active
    run, waiting on an interrupt still pending in its state, or idle."""
    if (
        Run.objects.filter(thread=thread, status__in=Run.ACTIVE)
        .exclude(pk=cancelled.pk)
        .exists()
    ):
        return Thread.Status.RUNNING
    if (
        thread.agent_version
        and compile_for(thread).get_state(thread_config(thread)).interrupts
    ):
        return Thread.Status.INTERRUPTED
    return Thread.Status.IDLE


def record_cancelled(
    *,
    run: Run,
    thread: Thread,
    actor: Actor,
    reason: str = "",
    publisher: streaming.Publisher | None = None,
) -> None:
    """Record a run as cancelled, in the caller's transaction, which holds the
    thread's row lock: a rollback deletes the checkpoints it wrote; its end
    is published once the transaction commits.

    `publisher` is the executing attempt's; a run cancelled before a worker
    claimed it (or after its worker was lost) publishes under a new attempt.
    """
    graph = compile_for(thread) if thread.agent_version else None
    if run.cancel_action == Run.CancelAction.ROLLBACK and graph is not None:
        graph.checkpointer.delete_for_runs([str(run.id)])
    run.status = Run.Status.CANCELLED
    run.ended_at = timezone.now()
    run.lease_owner, run.lease_until = "", None
    run.save(
        update_fields=[
            "status",
            "ended_at",
            "lease_owner",
            "lease_until",
            "cancel_action",
        ]
    )
    thread.status = _thread_status_after(thread, run)
    thread.save(update_fields=["status", "updated_at"])
    thread_event(
        thread=thread,
        kind=events.RUN_CANCELLED,
        actor=actor,
        run=run,
        data={"reason": reason or run.cancel_action or "cancelled"},
    )
    dispatch.thread_dispatch_next(thread)
    values = (
        graph.get_state(thread_config(thread)).values if graph is not None else None
    )
    end = streaming.outcome(status=run.status, values=values)
    publisher = publisher or streaming.Publisher(
        run_id=run.id,
        attempt=run.attempts + 1,
        cipher=ThreadCipher.for_thread(thread),
    )
    # Its waiting clients first, the webhooks' look-ups after (runs.wakeups).
    wakeups.on_commit(lambda: publisher.publish(streaming.END, end))


def _cancel(*, run: Run, thread: Thread, actor: Actor, action: str) -> None:
    """Cancel one active run, the thread's row lock held: a queued run at
    once; a running one is stopped by its worker at its next step."""
    run.cancel_action = action
    if run.status == Run.Status.QUEUED:
        record_cancelled(run=run, thread=thread, actor=actor)
        return
    run.save(update_fields=["cancel_action"])
    thread_event(
        thread=thread,
        kind=events.RUN_CANCEL_REQUESTED,
        actor=actor,
        run=run,
        data={"action": action},
    )


@transaction.atomic
def run_cancel(*, thread: Thread, run: Run, actor: Actor, action: str) -> Run:
    """Cancel a queued or running run of the thread (see `_cancel`); a run
    that carries a reviewer's decision only once it has written a
    checkpoint, and only with `interrupt` (`decision_resuming`)."""
    if action not in Run.CancelAction.values:
        raise InvalidRequest(
            f"action must be one of {', '.join(Run.CancelAction.values)}",
            field="action",
        )
    thread = _lock(thread)
    run = Run.objects.select_for_update(no_key=True).get(pk=run.pk, thread=thread)
    if not run.is_active:
        raise StateConflict(
            f"run {run.id} already ended ({run.status})", code="run_not_active"
        )
    if run.cancel_action:
        return run  # already being cancelled
    _refuse_cancelling_a_decision(thread, [run], action=action)
    _cancel(run=run, thread=thread, actor=actor, action=action)
    return run


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
    # VersionSkew when the pinned version is gone, or cannot run the thread.
    patches.ensure_fits(thread, spec_for(thread))
    return _queue(thread=thread, kind=Run.Kind.RETRY, actor=actor)


@transaction.atomic
def thread_close(*, thread: Thread, actor: Actor, note: str) -> Thread:
    """Give up on a failed thread: it becomes idle, its open approval requests
    are closed (runs.signals.thread_closed), the completed steps its failed
    compensation did not undo are settled (runs.sagas.settle: no
    later run undoes them), and the audit trail says who did it and which
    steps stay done; the note, free text, only as a digest."""
    note = (note or "").strip()
    if not note:
        raise InvalidRequest("closing a failed thread needs a note", field="note")
    thread, failed = _failed(thread)
    thread.status = Thread.Status.IDLE
    thread.save(update_fields=["status", "updated_at"])
    settled = sagas.settle(thread)
    record(
        tenant=thread.tenant,
        kind=events.THREAD_CLOSED,
        actor=actor,
        thread_id=thread.thread_id,
        run_id=str(failed.id),
        data={
            "note": digest(note),
            # Tool names and ledger ids, newest first: never their content.
            "not_undone": [call.tool for call in settled],
            "not_undone_calls": [call.pk for call in settled],
        },
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
    for run in Run.objects.select_for_update(no_key=True).filter(
        thread=thread, status__in=Run.ACTIVE
    ):
        run.status = Run.Status.CANCELLED
        run.ended_at = timezone.now()
        run.lease_owner, run.lease_until = "", None
        run.save(update_fields=["status", "ended_at", "lease_owner", "lease_until"])
        thread_event(
            thread=thread,
            kind=events.RUN_CANCELLED,
            actor=actor,
            run=run,
            data={"reason": reason},
        )
        cancelled += 1
    return cancelled


def run_errors_read(*, thread: Thread, runs: list[Run], actor: Actor) -> None:
    """Audit one `run.read` event for a response that decrypted the errors of
    `runs` (the failed ones among those it lists); nothing when none failed."""
    failed = [str(run.pk) for run in runs if run.error is not None]
    if failed:
        thread_event(
            thread=thread,
            kind=events.RUN_READ,
            actor=actor,
            data={"runs": len(failed), "run_ids": failed[:100]},
        )


def run_output_read(*, run: Run, thread: Thread, actor: Actor, how: str) -> None:
    """Record that a run's output (its stream, or its final values) was read
    decrypted: like every read of a thread's state, it is an audit event."""
    thread_event(
        thread=thread,
        kind=events.RUN_OUTPUT_READ,
        actor=actor,
        run=run,
        data={"how": how},
    )
