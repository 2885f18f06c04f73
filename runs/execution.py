"""Executing one run on a worker: claim it, hold its lease, run the graph, record.

At-least-once: a run whose worker died (SIGKILL, a deploy) keeps its status
`running` until its lease runs out; then `runs.dispatch.runs_recover_stalled`
dispatches it
again and the next worker takes it over. The graph continues from the run's
last checkpoint; side effects inside it go through `runs.tools.side_effect`,
so a repeated step does not repeat what already happened.
"""

from __future__ import annotations

import copy
import logging
import os
import socket
import threading
import time
import uuid
from contextlib import closing
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import close_old_connections, connection, transaction
from django.db.models import (
    Exists,
    Field,
    JSONField,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
)
from django.db.models.expressions import RawSQL
from django.utils import timezone
from langgraph.constants import CONFIG_KEY_CHECKPOINTER
from langgraph.types import Command, StateSnapshot

from audit import events
from audit.services import Actor, ChainedWriteMissed, announcements_held
from runs import (
    compensation,
    dispatch,
    graph_executor,
    outages,
    patches,
    replay,
    selectors,
    streaming,
    thread_connections,
    wakeups,
)
from runs.checkpointer import DjangoSaver, head_fingerprint_sql, latest_head_sql
from runs.context import RunContext
from runs.crypto import ThreadCipher
from runs.errors import VersionSkew
from runs.fixed_queries import FixedQuery
from runs.gates import gate_nodes_of
from runs.graphs import compiled, ensure_nodes_exist, spec_for, thread_config
from runs.models import Checkpoint, LeaseLost, Run, Thread
from runs.services.runs import record_cancelled
from runs.services.threads import thread_event
from runs.signals import InterruptRejected, run_interrupted

logger = logging.getLogger(__name__)
SYSTEM = Actor.system("worker")


def _one(queryset: QuerySet) -> Any:
    """The row of a query that matches one at most, or None: unlike first(),
    with no ORDER BY (the models' default orderings join and sort, and
    compiling them is a good part of the worker's CPU)."""
    for row in queryset.order_by()[:1]:
        return row
    return None


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
    # The thread's values when the run stopped, for the run's `end` event.
    values: Any = None
    # The cancel action that stopped the run, if it was cancelled.
    cancelled: str = ""
    # How the failed run undid what it did, if it had anything to undo.
    compensated: compensation.Compensated | None = None
    # The fingerprint of the saver's copy of the thread's head the state
    # above was built from (runs.checkpointer.DjangoSaver.head), checked
    # against the database's when the run is recorded; None if the state
    # was read from the database.
    head: str | None = None
    # Reads the state above from the database instead (see _read_state).
    reread: Any = None


class HeadChanged(Exception):
    """The database's head of the thread is not the saver's copy the run's
    outcome was built from: nothing recorded, the state is read again."""


class RunCancelled(Exception):
    def __init__(self, action: str) -> None:
        super().__init__(f"run cancelled ({action})")
        self.action = action


class CancelWatch:
    """Notices, between the graph's stream parts, that the run was cancelled.

    Looks the run up at most every CHECK_INTERVAL seconds, so that token-by-
    token streaming does not turn into a query per token.
    """

    CHECK_INTERVAL = 0.2

    def __init__(self, run_id) -> None:
        self.run_id = run_id
        self.checked_at = time.monotonic()

    def check(self) -> None:
        now = time.monotonic()
        if now - self.checked_at < self.CHECK_INTERVAL:
            return
        self.checked_at = now
        try:
            action = _one(
                Run.objects.filter(pk=self.run_id).values_list(
                    "cancel_action", flat=True
                )
            )
        except outages.DATABASE_ERRORS as error:
            if not outages.is_database_outage(error):
                raise
            outages.reconnect()  # look again at the next check
            return
        if action:
            raise RunCancelled(action)


class Leases:
    """Renews the leases of the runs this process executes, every third of
    their length, from one thread for all of them.

    A thread per run cost its start and its stop on every run (a few percent
    of a short run's CPU). Holding a run is an entry in a dict; the thread
    sleeps until the earliest renewal due, and at most a third of the lease
    when it holds none, so a run taken while it sleeps is renewed on time.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # run id -> (lease owner, when its renewal is due on time.monotonic())
        self._held: dict[Any, tuple[str, float]] = {}
        self._thread: threading.Thread | None = None
        os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self) -> None:
        # The parent's thread does not exist in the child, and its lock may
        # have been taken at the fork.
        self._lock = threading.Lock()
        self._held = {}
        self._thread = None

    def hold(self, run_id, owner: str) -> None:
        due = time.monotonic() + settings.GATEHOUSE_RUN_LEASE_SECONDS / 3
        with self._lock:
            self._held[run_id] = (owner, due)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._renew_forever, name="leases", daemon=True
                )
                self._thread.start()

    def release(self, run_id) -> None:
        """Renew the run's lease no more. A renewal under way may still land:
        it changes nothing once the run is recorded (it renews a run still
        `running` and held by this owner only)."""
        with self._lock:
            self._held.pop(run_id, None)

    def renew_now(self, run_id, owner: str) -> bool:
        """Renew the run's lease at once and hold it, if it is still this
        owner's and has not run out; False if it has (the recovery sweep
        may have handed the run to another worker already)."""
        renewed = _extend_lease(run_id, owner, unexpired=True)
        if renewed:
            self.hold(run_id, owner)
        return bool(renewed)

    def _renew_forever(self) -> None:
        while True:
            interval = settings.GATEHOUSE_RUN_LEASE_SECONDS / 3
            now = time.monotonic()
            with self._lock:
                due = [(r, o) for r, (o, at) in self._held.items() if at <= now]
            for run_id, owner in due:
                wait = self._renew(run_id, owner, interval)
                with self._lock:
                    if self._held.get(run_id, (None,))[0] == owner:
                        if wait is None:
                            del self._held[run_id]
                        else:
                            self._held[run_id] = (owner, time.monotonic() + wait)
            if due:
                # A connection only while renewing: back on the shelf of
                # the process's idle ones until the next renewal.
                thread_connections.release()
            with self._lock:
                next_at = min(
                    (at for _, at in self._held.values()),
                    default=time.monotonic() + interval,
                )
            time.sleep(max(0.0, min(next_at - time.monotonic(), interval)))

    def _renew(self, run_id, owner: str, interval: float) -> float | None:
        """Renew one lease; seconds until the next renewal, None for none."""
        try:
            thread_connections.bind()
            renewed = _extend_lease(run_id, owner)
        except Exception as error:
            if not outages.is_database_outage(error):
                # This run's lease is left to run out (as a thread of its own
                # would have died); the thread goes on for the others.
                logger.exception("run %s: its lease could not be renewed", run_id)
                return None
            # Renew as soon as the database is back, before the recovery
            # sweep takes the lease for expired.
            outages.reconnect()
            return min(1.0, interval)
        if not renewed:
            logger.warning("run %s: lease lost to another worker", run_id)
            return None
        return interval


LEASES = Leases()


def _extend_lease(run_id, owner: str, *, unexpired: bool = False) -> int:
    """Extend the run's lease by a lease length where it is still `running`
    and held by `owner` (and, `unexpired`, has not run out); the rows changed
    (0 or 1)."""
    now = timezone.now()
    still_held = Run.held(run_id, owner)
    if unexpired:
        still_held = still_held.filter(lease_until__gt=now)
    return still_held.update(lease_until=now + _lease_length(), heartbeat_at=now)


# The claim's and the finish's queries (why each is so: see _claim and
# _finish), compiled once per process (runs.fixed_queries); the argument of
# each is the run's id.
_SAMPLE_RUN_ID = uuid.UUID("5a3b1e00-0000-4000-8000-00000000c1a1")


def _runs_ahead(thread_id, run_id, created_at) -> QuerySet:
    """The runs a queued run of the thread waits for: runs of a thread
    execute one at a time, in creation order."""
    return (
        Run.objects.filter(thread_id=thread_id)
        .exclude(pk=run_id)
        .filter(
            Q(status__in=Run.ACTIVE, created_at__lte=created_at)
            | Q(status=Run.Status.RUNNING)
        )
        .order_by()
    )


def _claim_annotations() -> dict:
    """What the claim reads with the run: whether it waits for another run,
    what a resume must find in the graph, and whether the thread has a
    checkpoint (a thread's first run need not look for one: _invoke)."""
    return {
        "behind": Exists(
            _runs_ahead(OuterRef("thread_id"), OuterRef("pk"), OuterRef("created_at"))
        ),
        "checkpointed": Exists(
            Checkpoint.objects.filter(thread_id=OuterRef("thread_id")).order_by()
        ),
        "waiting_nodes": Subquery(
            selectors.waiting_nodes_query(OuterRef("thread_id")),
            output_field=JSONField(),
        ),
    }


# Built at their first call, as querysets may only be once the apps are loaded.
# The run's thread with its tenant, locked, if alive.
_CLAIM_THREAD = FixedQuery(
    lambda run_id: (
        Thread.objects.select_related("tenant")
        .select_for_update(of=("self",), no_key=True)
        .filter(
            deleted_at__isnull=True,
            pk=Subquery(
                Run.objects.filter(pk=run_id).order_by().values("thread_id")[:1]
            ),
        )
        .order_by()[:1]
    ),
    _SAMPLE_RUN_ID,
)
# The run, locked, with what the claim reads with it.
_CLAIM_RUN = FixedQuery(
    lambda run_id: (
        Run.objects.select_for_update(no_key=True)
        .annotate(**_claim_annotations())
        .filter(pk=run_id)
        .order_by()
    ),
    _SAMPLE_RUN_ID,
)
# The claim's first read, which locks nothing (see _claim_at_once), with
# the thread's latest root checkpoint (`head_*`: see _head_read_with).
_PEEK_RUN = FixedQuery(
    lambda run_id: (
        Run.objects.select_related("thread__tenant")
        .annotate(
            **_claim_annotations(),
            **{
                f"head_{part}": RawSQL(sql, (), output_field=Field())
                for part, sql in latest_head_sql(
                    f'"{Run._meta.db_table}"."thread_id"'
                ).items()
            },
        )
        .filter(pk=run_id)
        .order_by()
    ),
    _SAMPLE_RUN_ID,
)
_RUNS_AHEAD = FixedQuery(
    _runs_ahead, -0x5A3B1E, _SAMPLE_RUN_ID, datetime(1970, 1, 2, 3, 4, 5, 6, UTC)
)


# The finish's one query: the run with its thread and tenant, the thread and
# the run locked, in this order (a statement's FOR ... OF locks each row in
# the order it names the tables: _claim's lock order).
def _finish_query(run_id) -> QuerySet:
    return (
        Run.objects.select_related("thread__tenant")
        .select_for_update(of=("thread", "self"), no_key=True)
        .filter(pk=run_id, thread__deleted_at__isnull=True)
        .order_by()
    )


_FINISH = FixedQuery(_finish_query, _SAMPLE_RUN_ID)
# The fingerprint of the run's thread's head as stored, in a statement on
# runs_run (the finish's, and the one-statement success's condition).
_HEAD_AS_STORED = head_fingerprint_sql(f'"{Run._meta.db_table}"."thread_id"')
# The same, with the fingerprint of the thread's head as stored (Postgres):
# whether the saver's copy of it, which the run's outcome was built from,
# is what the database holds. The checkpoint tables are read as of the
# statement's start, not after its lock wait (READ COMMITTED re-reads only
# the locked rows): a head written by someone holding the thread's lock
# while the run runs would be missed, and no one writes one so (a run's
# thread takes no other writer of checkpoints while it runs: a fork, a
# migration, a state update are refused; _record_success_at_once likewise).
_FINISH_CHECKING_HEAD = FixedQuery(
    lambda run_id: _finish_query(run_id).annotate(head=RawSQL(_HEAD_AS_STORED, ())),
    _SAMPLE_RUN_ID,
)


def _first(rows: list) -> Any:
    return rows[0] if rows else None


def _the_run(rows: list[Run]) -> Run:
    """The one row of a run's query, as QuerySet.get would say it."""
    if not rows:
        raise Run.DoesNotExist("Run matching query does not exist.")
    return rows[0]


def _claim(run_id: str, owner: str) -> tuple[Run, Thread] | None:
    """Take the run if it is this worker's to execute; None otherwise.

    A queued run whose turn it is, the usual case, is taken in one
    statement (_claim_at_once); anything else, or a claim that finds things
    changed since it read them, is decided under the locks (_claim_locked)."""
    run_pk = uuid.UUID(str(run_id))  # the compiled queries take a UUID
    # The one statement locks rows in a subquery (FOR NO KEY UPDATE), which
    # only Postgres has; SQLite (the embedded mode) serialises its writers
    # anyway, so it always takes the locked path.
    if connection.vendor == "postgresql":
        run = _first(_PEEK_RUN(run_pk))
        if run is not None and _claim_at_once(run, owner):
            return run, run.thread
    return _claim_locked(run_pk, owner)


def _claim_at_once(run: Run, owner: str) -> bool:
    """Take a queued run whose turn it is, read a moment before without a
    lock (`run`, with its thread): its lease and `run.started` in one
    statement, in autocommit (no BEGIN, no locking reads, no COMMIT), which
    writes only if what the read saw still holds. False, with nothing
    written, for any other run, or if it no longer holds.

    The statement locks the thread, then the run (its update), the order
    every writer takes them in; a thread deleted or no longer `running` is
    not taken. Whether a run is ahead is read as of the statement's start,
    which may precede the thread's lock: a run ahead that ended meanwhile
    still counts as ahead (the claim then goes on under the locks), and
    none can have become active ahead of this one, since a run created
    later is created after it (under the thread's lock) and waits for it.
    The run's own row is checked as it is once locked."""
    thread = run.thread
    if not (
        run.status == Run.Status.QUEUED
        and run.attempts == 0
        and not run.behind
        and thread.deleted_at is None
        # As its run was queued: the claim changes nothing of the thread.
        and thread.status == Thread.Status.RUNNING
    ):
        return False
    _take(run, owner, timezone.now())
    ahead, ahead_params = _RUNS_AHEAD.statement(thread.pk, run.pk, run.created_at)
    return thread_event(
        thread=thread,
        kind=events.RUN_STARTED,
        actor=SYSTEM,
        run=run,
        data={"worker": owner, "attempt": run.attempts},
        saves=[(run, _CLAIMED_FIELDS)],
        where=[
            (
                f"status = %s AND attempts = 0 AND thread_id = ({_LIVE_THREAD}) "
                f"AND NOT EXISTS ({ahead})",
                [Run.Status.QUEUED, thread.pk, Thread.Status.RUNNING, *ahead_params],
            )
        ],
    )


# The run's thread, locked as _claim_locked locks it, if alive and running.
_LIVE_THREAD = (
    f"SELECT id FROM {Thread._meta.db_table} WHERE id = %s AND deleted_at IS NULL "
    "AND status = %s FOR NO KEY UPDATE"
)


def _take(run: Run, owner: str, now: datetime) -> None:
    """The run as a claim leaves it (_CLAIMED_FIELDS, to be saved)."""
    # Taken from the queue: no attempt ran before, so none wrote a
    # checkpoint (see _graph_input).
    run.first_attempt = run.status == Run.Status.QUEUED
    run.status = Run.Status.RUNNING
    run.lease_owner = owner
    run.lease_until = now + _lease_length()
    run.heartbeat_at = now
    run.attempts += 1
    run.started_at = run.started_at or now


def _claim_locked(run_pk: uuid.UUID, owner: str) -> tuple[Run, Thread] | None:
    """_claim, under the locks of the thread and the run."""
    with transaction.atomic():
        # Lock order everywhere: thread, then its runs (FOR NO KEY UPDATE:
        # see approvals.services.lifecycle for why never plain FOR UPDATE).
        # The run's thread is found inside the locking query: one round trip.
        thread = _first(_CLAIM_THREAD(run_pk))
        if thread is None:
            return None
        # With the thread locked no run of it changes (every writer locks the
        # thread first): what the run waits for, and what a resume must find
        # in the graph, are read with it, in its statement.
        run = _the_run(_CLAIM_RUN(run_pk))
        run.thread = thread  # the locked row, for whatever reads run.thread
        now = timezone.now()
        recovered_from = ""
        if run.status == Run.Status.RUNNING:
            if run.lease_owner == owner:
                # This claim committed, and then the connection was lost
                # before it said so: claimed again after the outage.
                return run, thread
            if run.lease_until and run.lease_until > now:
                return None  # another worker holds it: a duplicate delivery
            if run.cancel_action:
                # Cancelled while its worker was lost: nothing left to stop.
                record_cancelled(run=run, thread=thread, actor=SYSTEM)
                return None
            recovered_from = run.lease_owner
        elif run.status == Run.Status.QUEUED:
            if run.behind:
                return None  # runs of a thread execute one at a time, in order
            if (
                run.kind != Run.Kind.RESUME
                and thread.status == Thread.Status.INTERRUPTED
            ):
                # Queued behind a run that stopped on an interrupt: new input
                # would walk away from what the interrupt waits for.
                record_cancelled(
                    run=run,
                    thread=thread,
                    actor=SYSTEM,
                    reason="the thread waits on an interrupt; resume it instead",
                )
                return None
        else:
            return None  # finished or cancelled already
        _take(run, owner, now)
        # Saved with the first event, in its statement (thread_event).
        saves = [(run, _CLAIMED_FIELDS)]
        if thread.status != Thread.Status.RUNNING:
            thread.status = Thread.Status.RUNNING
            saves.append((thread, ("status", "updated_at")))
        if recovered_from:
            thread_event(
                thread=thread,
                kind=events.RUN_RECOVERED,
                actor=SYSTEM,
                run=run,
                data={"worker": recovered_from},
                saves=saves,
            )
            saves = []
        thread_event(
            thread=thread,
            kind=events.RUN_STARTED,
            actor=SYSTEM,
            run=run,
            data={"worker": owner, "attempt": run.attempts},
            saves=saves,
        )
        return run, thread


_CLAIMED_FIELDS = (
    "status",
    "lease_owner",
    "lease_until",
    "heartbeat_at",
    "attempts",
    "started_at",
)
_FINISHED_FIELDS = (
    "status",
    "next_nodes",
    "error_type",
    "error",
    "compensation",
    "ended_at",
    "lease_owner",
    "lease_until",
)


def _graph_input(
    run: Run, thread: Thread, cipher: ThreadCipher, *, untried: bool = False
) -> tuple[Any, dict]:
    """What to invoke the graph with: the run's input, or nothing to continue.

    A run that already wrote a checkpoint (an earlier attempt got that far)
    continues from the thread's latest checkpoint instead of starting over.
    `untried`: the graph never ran for this run (its first attempt, taken
    from the queue, before any outage restart): nothing to look for.
    """
    progressed = (
        not untried
        and Checkpoint.objects.filter(thread=thread, run_id=str(run.id)).exists()
    )
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
    if run.input is None:
        return None, config  # continue from the checkpoint as it is
    return cipher.decrypt_value(run.input, row=("run-input", str(run.id))), config


def _head_read_with(run: Run) -> tuple | None:
    """The thread's latest root checkpoint as the claim's first read found it
    with the run (_PEEK_RUN), or None (none, or read by another query).

    Read before the claim's statement took the run, and still the latest:
    that statement took it only if it was queued, never tried, with no run
    of its thread ahead of it or running, its thread alive and running, all
    as of the read (the claim's conditions); so no run wrote to the thread
    since, and none but this one will until it ends, and the others that
    write checkpoints (a fork, a state update, a migration) are refused while
    a run of the thread is queued or running."""
    checkpoint = getattr(run, "head_checkpoint", None)
    if checkpoint is None:
        return None
    return checkpoint, run.head_blobs, run.head_writes


def _stream_name(mode: str, namespace: tuple[str, ...]) -> str:
    """LangGraph API's event name: the mode, and a subgraph's namespace."""
    return "|".join((mode, *namespace))


def _invoke(
    run: Run,
    thread: Thread,
    publisher: streaming.Publisher,
    watch: CancelWatch,
    *,
    untried: bool = False,
) -> Outcome:
    spec = spec_for(thread, run.agent_version)
    patches.ensure_fits(thread, spec)
    graph = compiled(spec, thread.tenant)
    if run.kind == Run.Kind.RESUME:
        # The nodes recorded when the thread stopped: a graph that lost one of
        # them would silently resume nothing.
        waiting = getattr(run, "waiting_nodes", None)  # read when claimed
        if waiting is None:
            waiting = selectors.waiting_nodes(thread)
        ensure_nodes_exist(graph, waiting, key=spec.key)
    cipher = ThreadCipher.for_thread(thread)
    # The claim read the thread alive, locked: no look-up before the first write;
    # and, for the first attempt of a run from the thread's latest state, whether
    # there is a state to load (none: the thread's first run), and which.
    from_latest = untried and not run.checkpoint_id
    graph.checkpointer.adopt(
        thread,
        cipher,
        empty=from_latest and getattr(run, "checkpointed", None) is False,
        head=_head_read_with(run) if from_latest else None,
        # Every write for the run checks its lease (LeaseLost if lost).
        lease=(run.pk, run.lease_owner),
    )
    graph_input, config = _graph_input(run, thread, cipher, untried=untried)
    context = RunContext(
        tenant_id=thread.tenant_id,
        thread_pk=thread.pk,
        thread=thread,
        run_id=str(run.id),
        patches=frozenset(thread.patches),
        known_patches=spec.patches,
        retired_patches=spec.retired_patches,
        step_aliases=thread.step_aliases,
    )
    published = set(run.stream_modes)
    # Streaming even when nobody asked for a mode: the run is checked for a
    # cancellation between parts, that is between steps at least.
    parts = graph.stream(
        graph_input,
        config,
        context=context,
        durability="sync",
        stream_mode=sorted(published) or ["updates"],
        subgraphs=run.stream_subgraphs,
    )
    outcome = Outcome()
    try:
        with closing(parts), graph_executor.kept_pool():
            for part in parts:
                namespace, mode, chunk = part if run.stream_subgraphs else ((), *part)
                if mode in published:
                    publisher.publish(_stream_name(mode, namespace), chunk)
                watch.check()
    except RunCancelled as cancelled:
        # A cancelled run is recorded without its state (record_cancelled).
        outcome.cancelled = cancelled.action
        return outcome
    _read_state(outcome, graph, thread)
    return outcome


def _read_state(outcome: Outcome, graph, thread: Thread) -> StateSnapshot:
    """The thread's state as the run left it, into `outcome`: built from the
    saver's copy of the checkpoint the run last read or wrote (no round trip,
    no query), if it has one; _record_end then checks, in the statement
    that locks the run, that the database holds exactly those rows, and
    has the state read from the database otherwise (HeadChanged)."""

    def from_database() -> StateSnapshot:
        state = graph.get_state(thread_config(thread))
        _state_into(outcome, state)
        outcome.head = None
        return state

    outcome.reread = from_database
    saver = graph.checkpointer
    known = saver.head(thread.pk) if isinstance(saver, DjangoSaver) else None
    if known is None:
        return from_database()
    saved, fingerprint = known
    config = thread_config(thread)
    # get_state takes its saver from here: one that answers `saved`.
    config["configurable"][CONFIG_KEY_CHECKPOINTER] = saver.answering(saved)
    state = graph.get_state(config)
    _state_into(outcome, state)
    outcome.head = fingerprint
    return state


def _state_into(outcome: Outcome, state) -> None:
    outcome.interrupts = list(state.interrupts)
    outcome.next_nodes = list(state.next)
    outcome.gate_nodes = gate_nodes_of(state)
    outcome.values = state.values


def _invoke_through_outages(
    run: Run, thread: Thread, publisher: streaming.Publisher
) -> Outcome:
    """_invoke, continued from the run's last checkpoint when the database
    went away under it: a lost connection is not the agent's failure.

    The checkpoint store retries its own writes (runs.checkpointer) and the
    cancel check skips a beat; this covers the rest (reading the graph's
    state, the side-effect ledger), repeating at most the step that was
    under way, whose side effects the ledger does not repeat. Outages for
    longer than GATEHOUSE_OUTAGE_RETRY_SECONDS raise, leaving the run to
    the recovery sweep.
    """
    give_up_at = None
    untried = getattr(run, "first_attempt", False)
    while True:
        try:
            return _invoke(run, thread, publisher, CancelWatch(run.id), untried=untried)
        except Exception as error:
            if not outages.is_database_outage(error):
                raise
            now = time.monotonic()
            give_up_at = give_up_at or now + settings.GATEHOUSE_OUTAGE_RETRY_SECONDS
            if now > give_up_at:
                raise
        untried = False  # it may have written checkpoints before the outage
        logger.warning(
            "run %s: the database went away mid-run; continuing from its last "
            "checkpoint once it is back",
            run.id,
        )
        outages.through_outages(
            lambda: Run.objects.filter(pk=run.pk).exists(),
            what=f"run {run.id}: waiting for the database",
        )


def _final_values(thread: Thread, run: Run) -> Any:
    """The thread's values after a failed run, best effort: a failure may
    come from the state itself."""
    try:
        return (
            compiled(spec_for(thread, run.agent_version), thread.tenant)
            .get_state(thread_config(thread))
            .values
        )
    except Exception:  # noqa: BLE001  the run's own error is what gets reported
        return None


def _error_type(error: BaseException) -> str:
    if isinstance(error, compensation.RecordedFailure):
        return error.error_type
    return type(error).__name__


def _error_text(error: BaseException) -> str:
    if isinstance(error, compensation.RecordedFailure):
        return str(error)  # recorded with its type already
    return f"{_error_type(error)}: {error}"[:2000]


def _end_event(run: Run, outcome: Outcome, error: BaseException | None) -> dict:
    return streaming.outcome(
        status=run.status,
        values=outcome.values,
        interrupts=outcome.interrupts if run.status == Run.Status.INTERRUPTED else [],
        error=None
        if error is None
        else {"error": _error_type(error), "message": str(error)},
    )


def _finish(
    run_id: str,
    owner: str,
    outcome: Outcome,
    publisher: streaming.Publisher,
    claimed: tuple[Run, Thread] | None = None,
) -> None:
    """Record how the run ended, in one transaction. An interrupt a receiver
    of run_interrupted rejects rolls that transaction back whole, with
    whatever the receivers wrote (no savepoint around them: its SAVEPOINT
    and RELEASE were two round trips on every interrupted run), and the run
    is then recorded failed with the receiver's message. A success, with
    the rows as `claimed` (the claim's), first in one statement
    (_record_success_at_once)."""
    if claimed is not None and _record_success_at_once(
        *claimed, owner, outcome, publisher
    ):
        return
    try:
        _record_end(run_id, owner, outcome, publisher)
    except InterruptRejected as rejected:
        outcome.error = rejected
        _record_end(run_id, owner, outcome, publisher)


def _record_success_at_once(
    claimed_run: Run,
    claimed_thread: Thread,
    owner: str,
    outcome: Outcome,
    publisher: streaming.Publisher,
) -> bool:
    """Record a run that succeeded, with its event, in one statement in
    autocommit (no BEGIN, no locking read, no COMMIT), which writes only
    where what _record_end would check under the locks holds: the run still
    `running` and held by this owner (the late-write rule), its thread
    alive, locked in the statement (thread, then run: the lock order), and,
    for a state built from the saver's copy, the thread's head still that
    copy and its key not shredded. False, with nothing written, for anything
    else (a failure, an interrupt, a cancellation, SQLite, a transaction
    under way), or where a condition does not hold: _record_end decides.

    The run's and the thread's rows change as _record_end changes them for
    a success: the run's status, end and lease, the thread's status (the
    fields it writes back as it read them, left as they are); the thread's
    update is chained to the run's (audit.services.record_with_write), so
    both or neither are written, with the event."""
    if (
        outcome.error is not None
        or outcome.interrupts
        or outcome.cancelled
        or outcome.compensated is not None
        or connection.vendor != "postgresql"
        or not connection.get_autocommit()
    ):
        return False
    # Copies: the claim's rows stay as they were if nothing is written.
    run, thread = copy.copy(claimed_run), copy.copy(claimed_thread)
    run.status = Run.Status.SUCCEEDED
    run.ended_at = timezone.now()
    run.lease_owner, run.lease_until = "", None
    thread.status = Thread.Status.IDLE
    alive = "deleted_at IS NULL"
    condition = "status = %s AND lease_owner = %s AND thread_id = ({thread})"
    params: list[Any] = [Run.Status.RUNNING, owner, thread.pk]
    if outcome.head is not None:
        alive += " AND wrapped_data_key IS NOT NULL"
        condition += f" AND {_HEAD_AS_STORED} = %s"
        params.append(outcome.head)
    locked_thread = (
        f"SELECT id FROM {Thread._meta.db_table} WHERE id = %s AND {alive} "
        "FOR NO KEY UPDATE"
    )
    written = False
    try:
        # Its event announced after the run's end is published and the
        # thread's next run dispatched: as after _record_end's commit, the
        # waiting clients first, the webhooks' look-ups after (runs.wakeups).
        with announcements_held():
            written = thread_event(
                thread=thread,
                kind=events.RUN_SUCCEEDED,
                actor=SYSTEM,
                run=run,
                data={},
                saves=[
                    (run, ("status", "ended_at", "lease_owner", "lease_until")),
                    (thread, ("status", "updated_at")),
                ],
                where=[
                    (condition.format(thread=locked_thread), params),
                    ("EXISTS (SELECT 1 FROM w0)", ()),
                ],
                chained=True,
            )
            if written:
                end = _end_event(run, outcome, None)
                ended = streaming.ended_columns(run)
                # Committed already: at once.
                wakeups.on_commit(lambda: publisher.publish(streaming.END, end, ended))
                wakeups.on_commit(lambda: dispatch.thread_dispatch_next(thread))
    except ChainedWriteMissed:
        return False  # the statement failed whole: _record_end decides
    return written


def _record_end(
    run_id: str, owner: str, outcome: Outcome, publisher: streaming.Publisher
) -> None:
    run_pk = uuid.UUID(str(run_id))  # the compiled queries take a UUID
    with transaction.atomic():
        # Both rows in one round trip, each read as it is once locked,
        # whatever committed while the statement waited for the lock (the
        # head's fingerprint is not: see _FINISH_CHECKING_HEAD).
        finish = _FINISH if outcome.head is None else _FINISH_CHECKING_HEAD
        run = _first(finish(run_pk))
        if run is None:
            return  # its thread deleted while running: nothing left to record
        thread = run.thread  # the locked row: receivers read run.thread
        if not run.held_by(owner):
            raise LeaseLost(f"run {run_id} finished after losing its lease")
        if outcome.cancelled:
            record_cancelled(run=run, thread=thread, actor=SYSTEM, publisher=publisher)
            return
        if outcome.head is not None and (
            run.head != outcome.head or thread.wrapped_data_key is None
        ):
            # Written meanwhile by another (none may write to a thread whose
            # run is running: a fork, a state update, a migration wait for
            # it), or shredded: what the run leaves is the database's.
            raise HeadChanged(run_id)
        error = outcome.error
        if outcome.interrupts:  # the nodes it stopped before, even if rejected
            run.next_nodes = outcome.next_nodes
        if error is None and outcome.interrupts:
            run.status = Run.Status.INTERRUPTED
            # InterruptRejected leaves the transaction: see _finish.
            run_interrupted.send(sender=Run, run=run, interrupts=outcome.interrupts)
        cipher = ThreadCipher.for_thread(thread)
        compensated = outcome.compensated
        if error is not None:
            run.status = Run.Status.FAILED
            run.error_type = _error_type(error)[:200]
            run.error = cipher.encrypt_value(
                compensated.error_text if compensated else _error_text(error),
                row=("run-error", str(run.id)),
            )
            thread.status = Thread.Status.ERROR
            kind, data = events.RUN_FAILED, {"error_type": run.error_type}
            if compensated:
                run.compensation = compensated.status
                data["compensation"] = compensated.status
                if compensated.status == Run.Compensation.COMPENSATED:
                    # Nothing is left to do: a retry would act on undone steps.
                    thread.status = Thread.Status.IDLE
                    thread_event(
                        thread=thread,
                        kind=events.RUN_COMPENSATED,
                        actor=SYSTEM,
                        run=run,
                        data={"steps": compensated.undone},
                    )
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
        thread_event(
            thread=thread,
            kind=kind,
            actor=SYSTEM,
            run=run,
            data=data,
            saves=[
                (run, _FINISHED_FIELDS),
                (thread, ("status", "gated_nodes", "updated_at")),
            ],
        )
        end = _end_event(run, outcome, error)
        ended = streaming.ended_columns(run)
        # Its waiting clients first, the webhooks' look-ups after (runs.wakeups).
        wakeups.on_commit(lambda: publisher.publish(streaming.END, end, ended))
        # Then the thread's next queued run, looked up once this commits: in
        # the locking statement, a subquery would read the runs as of the
        # statement's start, before a run queued while it waited for the
        # thread's lock (that run's claim, finding this one running, left it
        # to this finish). Off the path to the waiting client, a round trip
        # that was on it; a lookup lost to an outage leaves the run to the
        # recovery sweep, as a lost dispatch does.
        wakeups.on_commit(lambda: dispatch.thread_dispatch_next(thread))


def execute(run_id: str) -> None:
    """Execute a run if it is this worker's to execute (see _claim)."""
    close_old_connections()
    owner = new_lease_owner()
    claimed = outages.through_outages(
        lambda: _claim(run_id, owner), what=f"run {run_id}: claiming"
    )
    if claimed is None:
        return
    run, thread = claimed
    publisher = streaming.Publisher(
        run_id=run.id, attempt=run.attempts, cipher=ThreadCipher.for_thread(thread)
    )
    publisher.publish(
        streaming.METADATA, {"run_id": str(run.id), "attempt": run.attempts}
    )
    LEASES.hold(run.id, owner)
    try:
        outcome = _run(run, thread, publisher, owner)
    except LeaseLost as lost:
        _lease_lost(lost)
        return
    except Exception as exc:
        if not outages.is_database_outage(exc):
            raise
        # Nothing can be recorded: the lease runs out and the recovery sweep
        # dispatches the run again once the database is back.
        logger.warning("run %s: the database stayed unavailable", run_id)
        return
    finally:
        LEASES.release(run.id)
        replay.forget_run(run_id)

    def finish() -> None:
        nonlocal outcome
        try:
            _finish(run_id, owner, outcome, publisher, (run, thread))
        except HeadChanged:
            # Renewed and held again: reading the state may fail the run, and
            # undoing its side effects (compensation) must not outlive the
            # lease, or the recovery sweep would start a second worker undoing
            # them. A lease already run out (the first finish retried through
            # an outage, say) leaves the run to the sweep, recording nothing.
            if not LEASES.renew_now(run.id, owner):
                raise LeaseLost(
                    f"run {run_id}: its lease ran out before its finish"
                ) from None
            try:
                outcome = _read_again(run, thread, owner, outcome)
            finally:
                LEASES.release(run.id)
            _finish(run_id, owner, outcome, publisher)

    try:
        outages.through_outages(finish, what=f"run {run_id}: recording its outcome")
    except LeaseLost as lost:
        _lease_lost(lost)


def _lease_lost(lost: LeaseLost) -> None:
    """A run this worker no longer holds (LeaseLost: a checkpoint write
    refused, compensation or the finish finding the lease gone) stops here:
    nothing is recorded for it, no failure, no compensation, no event; the
    worker that took it over (or the recovery sweep) carries it on."""
    logger.warning("%s; stopped, nothing recorded", lost)


def _read_again(run: Run, thread: Thread, owner: str, outcome: Outcome) -> Outcome:
    """The outcome with the state read from the database, as _run would have
    read it (an error reading it fails the run, as it would have there)."""
    try:
        outcome.reread()
    except Exception as exc:
        if outages.is_database_outage(exc):
            raise
        return _failed(
            run, thread, owner, Outcome(error=exc, values=_final_values(thread, run))
        )
    return outcome


def _run(
    run: Run, thread: Thread, publisher: streaming.Publisher, owner: str
) -> Outcome:
    """Run the graph, or carry on undoing a failure (runs.compensation); a
    failure for good undoes the saga's completed steps. A database outage
    that outlasts the retries is raised: it is nobody's failure."""
    failure = compensation.unfinished(run, thread)
    if failure is not None:
        outcome = Outcome(error=failure, values=_final_values(thread, run))
    else:
        try:
            outcome = _invoke_through_outages(run, thread, publisher)
        except VersionSkew as skew:
            return Outcome(error=skew)  # the thread is left as it is
        except LeaseLost:
            raise  # not the agent's failure: nothing to record or undo
        except Exception as exc:  # the agent's own failure ends the run, not the worker
            if outages.is_database_outage(exc):
                raise
            logger.info("run %s failed: %s", run.id, type(exc).__name__)
            outcome = Outcome(error=exc, values=_final_values(thread, run))
    return _failed(run, thread, owner, outcome)


def _failed(run: Run, thread: Thread, owner: str, outcome: Outcome) -> Outcome:
    """A failed run's outcome, with how it undid what it did (if it did)."""
    if outcome.error is not None:
        outcome.compensated = compensation.compensate(
            run=run,
            thread=thread,
            owner=owner,
            error_type=_error_type(outcome.error),
            error_text=_error_text(outcome.error),
        )
    return outcome
