"""Thread use cases: create, change metadata, copy, read state and history
(audited), fork."""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Model
from django.utils.crypto import salted_hmac
from langgraph.errors import InvalidUpdateError

from audit import events
from audit.redaction import MAX_TEXT, is_clear_scalar
from audit.services import Actor, record, record_with_write
from runs import gates, registry, selectors
from runs.checkpointer import DjangoSaver
from runs.crypto import CryptoError, ThreadDeleted
from runs.errors import InvalidRequest, StateConflict
from runs.fixed_queries import (
    insert_statement,
    inserted,
    row_gone,
    save_fields,
    save_new,
    update_statement,
)
from runs.graphs import compile_for, spec_for, thread_config
from runs.models import Run, Tenant, Thread

logger = logging.getLogger(__name__)

# Matched whole (fullmatch): with re.match, "$" also matches before a final
# newline, and "case-9\n" passed (a 500 once it reached a header).
THREAD_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,254}")
# Metadata key an agent's client uses to tag the data subject of a thread; it
# is kept only as a keyed hash (a blind index) for deletion requests.
SUBJECT_KEY = "subject"


def subject_hash(subject: str) -> str:
    """The blind index of a data subject: HMAC-SHA256 under a key derived from
    SECRET_KEY (Django's salted_hmac); the subject itself is never stored."""
    return salted_hmac(
        "gatehouse-subject:",
        subject.strip().lower(),
        secret=settings.SECRET_KEY,
        algorithm="sha256",
    ).hexdigest()


def _split_metadata(
    spec: registry.AgentSpec, metadata: dict[str, Any]
) -> tuple[dict, str]:
    allowed = spec.safe_metadata_keys
    unknown = sorted(set(metadata) - allowed - {SUBJECT_KEY})
    if unknown:
        allowed_text = ", ".join(sorted(allowed | {SUBJECT_KEY}))
        raise InvalidRequest(
            f"keys {', '.join(unknown)} are not declared safe by agent {spec.name}; "
            f"metadata is stored in clear and may hold only: {allowed_text}",
            field="metadata",
        )
    for key in sorted(set(metadata) - {SUBJECT_KEY}):
        if not is_clear_scalar(metadata[key]):
            raise InvalidRequest(
                f"metadata {key!r} must be a string of at most {MAX_TEXT} "
                "characters, a number, a boolean or null: metadata is stored in "
                "clear and outlives the thread's content",
                field="metadata",
            )
    subject = metadata.get(SUBJECT_KEY)
    if subject is not None and (not isinstance(subject, str) or not subject.strip()):
        raise InvalidRequest("subject must be a non-empty string", field="metadata")
    clear = {key: value for key, value in metadata.items() if key != SUBJECT_KEY}
    return clear, subject_hash(subject) if subject else ""


def thread_event(
    *,
    thread: Thread,
    kind: events.EventKind,
    actor: Actor,
    run: Run | None = None,
    data: dict[str, Any] | None = None,
    inserts: Sequence[Model] = (),
    saves: Sequence[tuple[Model, Sequence[str]]] = (),
    unless_taken: bool = False,
    where: Sequence[tuple[str, Sequence[Any]]] = (),
    chained: bool = False,
) -> bool:
    """Record an event about a thread (and one of its runs) in the audit
    trail, in the caller's transaction; with `inserts`, new rows inserted
    with it, and with `saves`, rows and the fields to save of each, saved
    with it: in the same statement where they can be
    (audit.services.record_with_write), one round trip instead of one each.

    `unless_taken`, with one row in `inserts` and no `saves`: if a row with
    the same unique key is there already, nothing is written and no event
    recorded, and the answer is False (True otherwise). The statement then
    needs no transaction: outside one, it is its own.

    `where`, with `saves` alone: for each, a condition (SQL and parameters)
    its row must meet to be saved, in the statement of the event; False,
    with nothing written, where the (first) save's row does not meet it, or
    only Model.save may save one of them (record_with_write says what
    several writes of which only some find their row do). `chained`, with
    `where`: record_with_write's (each later condition reads `w0`, the first
    save's rows): one statement, in autocommit too, all or nothing."""
    event = {
        "tenant": thread.tenant,
        "kind": kind,
        "actor": actor,
        "thread_id": thread.thread_id,
        "run_id": str(run.id) if run is not None else "",
        "data": data,
    }
    if unless_taken and (len(inserts) != 1 or saves):
        raise ValueError("unless_taken is for one insert alone")
    if where and (inserts or len(where) != len(saves)):
        raise ValueError("where is for saves alone, a condition for each")
    writes = [insert_statement(row, ignore_conflicts=unless_taken) for row in inserts]
    writes += [
        update_statement(row, fields, where=condition)
        for (row, fields), condition in zip(
            saves, where or [("", ())] * len(saves), strict=True
        )
    ]
    if where and None in writes:
        return False
    if chained and not where:
        raise ValueError("chained is for saves with conditions")
    if not writes or None in writes:
        with transaction.atomic(savepoint=False):
            for row in inserts:
                if not save_new(row, ignore_conflicts=unless_taken):
                    return False
            for row, fields in saves:
                save_fields(row, fields)
            record(**event)
        return True
    recorded, _ = record_with_write(*writes, chained=chained, **event)
    if recorded is None:
        if unless_taken or where:
            return False
        raise row_gone()  # as Model.save says it
    for row in inserts:
        inserted(row)
    return True


def _agent_spec(agent: str) -> registry.AgentSpec:
    try:
        return registry.latest(agent)
    except registry.UnknownAgent:
        known = sorted({spec.name for spec in registry.agents().values()})
        raise InvalidRequest(
            f"no agent {agent!r} is registered; known agents: {', '.join(known)}",
            field="agent",
        ) from None


def _thread_spec(thread: Thread) -> registry.AgentSpec | None:
    """The spec whose declarations rule the thread's metadata, if it has one."""
    if not thread.agent_name:
        return None
    if thread.agent_version:
        return spec_for(thread)
    return _agent_spec(thread.agent_name)


def _metadata_for(
    spec: registry.AgentSpec | None, metadata: dict[str, Any]
) -> tuple[dict, str]:
    if spec is None:
        if metadata:
            raise InvalidRequest(
                "a thread without an agent stores no metadata: name its agent "
                "first, whose declarations say which keys may be stored",
                field="metadata",
            )
        return {}, ""
    return _split_metadata(spec, metadata)


def run_metadata(thread: Thread, metadata: dict[str, Any] | None) -> dict:
    """A run's metadata checked like the thread's (no subject: runs have none)."""
    spec = _thread_spec(thread)
    clear, subject = _metadata_for(spec, metadata or {})
    if subject:
        raise InvalidRequest(
            "a run's metadata names no subject: tag the thread", field="metadata"
        )
    return clear


def _check_thread_id(thread_id: str) -> None:
    if not THREAD_ID_RE.fullmatch(thread_id):
        raise InvalidRequest(
            "use 1 to 255 letters, digits, '.', '_', ':' or '-', starting with a "
            "letter or digit",
            field="thread_id",
        )


def thread_create(
    *,
    tenant: Tenant,
    agent: str | None,
    actor: Actor,
    thread_id: str | None = None,
    metadata: dict[str, Any] | None = None,
) -> Thread:
    """A new thread of `agent`, or with no agent yet (its first run binds
    one; until then it stores no metadata). StateConflict if the tenant has
    a live thread `thread_id` already."""
    thread_id = thread_id or uuid.uuid4().hex
    _check_thread_id(thread_id)
    spec = _agent_spec(agent) if agent is not None else None
    clear_metadata, subject = _metadata_for(spec, metadata or {})
    fields = {
        "tenant": tenant,
        "thread_id": thread_id,
        "agent_name": spec.name if spec else "",
        "metadata": clear_metadata,
        "subject_hash": subject,
    }
    created = {
        "kind": events.THREAD_CREATED,
        "actor": actor,
        "data": {"agent": spec.name if spec else "(none yet)"},
    }
    # Where the id can be taken first (Postgres), its row, with its key, and
    # its event in one statement, which is its own transaction outside the
    # caller's (no BEGIN nor COMMIT) and needs no look-up first: a live
    # thread with the same id (the partial unique key) makes it write
    # nothing, waiting first for a concurrent insert of the same id.
    thread = Thread.objects.unsaved_with_data_key(**fields)
    if thread is None:
        with transaction.atomic():
            if selectors.live_thread(tenant, thread_id) is not None:
                raise _thread_exists(thread_id)
            thread = Thread.objects.create_with_data_key(**fields)
            thread_event(thread=thread, **created)
        return thread
    if not thread_event(thread=thread, inserts=[thread], unless_taken=True, **created):
        raise _thread_exists(thread_id)
    return thread


def _thread_exists(thread_id: str) -> StateConflict:
    return StateConflict(f"thread {thread_id} already exists", code="thread_exists")


@transaction.atomic
def thread_metadata_update(
    *, thread: Thread, metadata: dict[str, Any], actor: Actor
) -> Thread:
    """Merge `metadata` into the thread's (the same rules as at creation)."""
    thread = Thread.objects.select_for_update(no_key=True).get(pk=thread.pk)
    clear, subject = _metadata_for(_thread_spec(thread), metadata)
    thread.metadata = {**thread.metadata, **clear}
    if subject:
        thread.subject_hash = subject
    thread.save(update_fields=["metadata", "subject_hash", "updated_at"])
    thread_event(
        thread=thread,
        kind=events.THREAD_METADATA_CHANGED,
        actor=actor,
        data={"keys": ", ".join(sorted(metadata)) or "none"},
    )
    return thread


@transaction.atomic
def thread_copy(
    *, thread: Thread, actor: Actor, thread_id: str | None = None
) -> Thread:
    """A new thread with the same agent, metadata and checkpoints (re-encrypted
    under its own key). Only a quiet thread is copied: a copy of a thread
    waiting on an interrupt would be a second way past it."""
    thread = Thread.objects.select_for_update(no_key=True).get(pk=thread.pk)
    _require_quiet(thread)
    if thread.status == Thread.Status.INTERRUPTED:
        raise StateConflict(
            f"thread {thread.thread_id} is waiting on an interrupt; copy it once "
            "the interrupt is resolved",
            code="thread_interrupted",
        )
    # A thread stopped past a gate (failed after its decision): the copy
    # would continue there under its own idempotency keys, acting again.
    latest_continuation_check(thread, doing="a copy of the thread")
    thread_id = thread_id or str(uuid.uuid4())
    _check_thread_id(thread_id)
    copy = Thread.objects.create_with_data_key(
        tenant=thread.tenant,
        thread_id=thread_id,
        agent_name=thread.agent_name,
        agent_version=thread.agent_version,
        status=thread.status,
        metadata=thread.metadata,
        subject_hash=thread.subject_hash,
    )
    DjangoSaver(tenant=thread.tenant).copy_thread(thread.thread_id, copy.thread_id)
    thread_event(
        thread=copy,
        kind=events.THREAD_COPIED,
        actor=actor,
        data={"source_thread_id": thread.thread_id},
    )
    return copy


def latest_continuation_check(thread: Thread, *, doing: str) -> None:
    """ApprovalRequired when the thread's latest checkpoint would continue at
    a node past an approval gate: `doing` must not take that continuation
    (only the decision's own resume, or a compliance officer's Retry, may)."""
    if not thread.agent_version:
        return
    graph = compile_for(thread)
    gates.check_continuation(
        thread=thread,
        graph=graph,
        next_nodes=graph.get_state(thread_config(thread)).next,
        doing=doing,
    )


def _require_quiet(thread: Thread) -> None:
    if Run.objects.filter(thread=thread, status__in=Run.ACTIVE).exists():
        raise StateConflict(
            f"a run of thread {thread.thread_id} is queued or running",
            code="run_in_progress",
        )


def _require_checkpoint(graph, thread: Thread, checkpoint_id: str):
    snapshot = graph.get_state(thread_config(thread, checkpoint_id))
    if not snapshot.config or snapshot.created_at is None:
        raise InvalidRequest(
            f"thread {thread.thread_id} has no checkpoint {checkpoint_id}",
            field="checkpoint_id",
        )
    return snapshot


def thread_snapshot(
    *,
    thread: Thread,
    checkpoint_id: str | None = None,
    subgraphs: bool = False,
):
    """The thread's state (latest, or at a checkpoint), decrypted, or None
    before its first checkpoint. Not audited: `thread_state` is, and a caller
    that shows it inside a larger read records that read itself (the desk's
    card, a search's page), one event per request. `subgraphs` reads the state
    of subgraphs that are mid-run too."""
    if not thread.agent_version:
        return None
    graph = compile_for(thread)
    if checkpoint_id:
        snapshot = _require_checkpoint(graph, thread, checkpoint_id)
        if subgraphs:
            snapshot = graph.get_state(
                thread_config(thread, checkpoint_id), subgraphs=True
            )
        return snapshot
    snapshot = graph.get_state(thread_config(thread), subgraphs=subgraphs)
    return None if snapshot.created_at is None else snapshot


def thread_state(
    *,
    thread: Thread,
    actor: Actor,
    checkpoint_id: str | None = None,
    subgraphs: bool = False,
):
    """`thread_snapshot`, audited as one `thread.state_read` event."""
    snapshot = thread_snapshot(
        thread=thread, checkpoint_id=checkpoint_id, subgraphs=subgraphs
    )
    if snapshot is not None:
        thread_event(
            thread=thread,
            kind=events.STATE_READ,
            actor=actor,
            data={"checkpoint_id": snapshot.config["configurable"]["checkpoint_id"]},
        )
    return snapshot


def thread_states_read(
    *, tenant: Tenant, threads: list[Thread], actor: Actor
) -> dict[int, Any]:
    """The latest state of each of a page of the tenant's threads (a search),
    by thread pk: a snapshot, None before a first checkpoint, or the
    CryptoError that kept one thread from being read (the others still are).
    Audited as one `thread.states_read` event naming the threads read."""
    states: dict[int, Any] = {}
    for thread in threads:
        try:
            states[thread.pk] = thread_snapshot(thread=thread)
        except CryptoError as exc:
            # Deleted meanwhile, or failing authentication: that thread only.
            if not isinstance(exc, ThreadDeleted):
                logger.error("state of thread %s unreadable: %s", thread.pk, exc)
            states[thread.pk] = exc
    read = [
        thread.thread_id
        for thread in threads
        if states[thread.pk] is not None
        and not isinstance(states[thread.pk], CryptoError)
    ]
    if read:
        record(
            tenant=tenant,
            kind=events.STATES_READ,
            actor=actor,
            data={"count": len(read), "thread_ids": read[:100]},
        )
    return states


def thread_interrupts_read(*, thread: Thread, actor: Actor) -> list[dict[str, Any]]:
    """The values of the thread's open interrupts, decrypted; audited as one
    `thread.read` event when there were any to decrypt. Content that fails to
    decrypt is one interrupt shown as unreadable: the thread's page works."""
    try:
        interrupts = selectors.thread_interrupts(thread)
    except CryptoError as exc:
        if isinstance(exc, ThreadDeleted):
            raise
        logger.error("interrupts of thread %s unreadable: %s", thread.pk, exc)
        return [{"id": "", "value": {"unreadable": type(exc).__name__}}]
    if interrupts:
        record(
            tenant=thread.tenant,
            kind=events.THREAD_READ,
            actor=actor,
            thread_id=thread.thread_id,
            data={"interrupts": len(interrupts)},
        )
    return interrupts


def thread_history(
    *,
    thread: Thread,
    actor: Actor,
    limit: int,
    before: str | None = None,
    metadata: dict[str, Any] | None = None,
) -> list:
    """Checkpoints with their values, newest first, decrypted; audited."""
    if not thread.agent_version:
        return []
    graph = compile_for(thread)
    snapshots = list(
        graph.get_state_history(
            thread_config(thread),
            limit=limit,
            before=thread_config(thread, before, field="before") if before else None,
            filter=metadata or None,
        )
    )
    thread_event(
        thread=thread,
        kind=events.HISTORY_READ,
        actor=actor,
        data={"count": len(snapshots)},
    )
    return snapshots


def thread_latest_checkpoint_id(thread: Thread) -> str | None:
    if not thread.agent_version:
        return None
    snapshot = compile_for(thread).get_state(thread_config(thread))
    if snapshot.created_at is None:
        return None
    return snapshot.config["configurable"]["checkpoint_id"]


def thread_fork(
    *,
    thread: Thread,
    checkpoint_id: str,
    values: dict[str, Any] | None,
    actor: Actor,
    as_node: str | None = None,
) -> str:
    """A new checkpoint branching from `checkpoint_id` with `values` applied
    (LangGraph's update_state), written as `as_node` when given.

    Refused with ApprovalRequired while the thread has an open approval
    request, when `as_node` is a gated node or one past a gate, and when the
    new checkpoint would continue past a gate (runs.gates): a fork never
    stands in for a decision. The fork is audited with its actor.
    """
    with transaction.atomic():
        thread = (
            Thread.objects.select_related("tenant")
            .select_for_update(of=("self",), no_key=True)
            .get(pk=thread.pk)
        )
        _require_quiet(thread)
        if not thread.agent_version:
            raise InvalidRequest(
                "the thread has no checkpoints yet", field="checkpoint_id"
            )
        graph = compile_for(thread)
        _require_checkpoint(graph, thread, checkpoint_id)
        if as_node is not None and as_node not in graph.nodes:
            raise InvalidRequest(
                f"agent {thread.agent_name}@{thread.agent_version} has no node {as_node!r}",
                field="as_node",
            )
        gates.check_fork(thread=thread, graph=graph, as_node=as_node)
        try:
            new_config = graph.update_state(
                thread_config(thread, checkpoint_id), values, as_node=as_node
            )
        except (InvalidUpdateError, ValueError, KeyError, TypeError) as exc:
            # LangGraph's own validation of the values against the state schema.
            raise InvalidRequest(
                f"cannot fork with these values: {exc}", field="values"
            ) from None
        new_id = new_config["configurable"]["checkpoint_id"]
        # Refused here, the new checkpoint is rolled back with the transaction.
        gates.check_continuation(
            thread=thread,
            graph=graph,
            next_nodes=graph.get_state(new_config).next,
            doing="this fork",
        )
        thread_event(
            thread=thread,
            kind=events.THREAD_FORKED,
            actor=actor,
            data={
                "checkpoint_id": new_id,
                "parent_checkpoint_id": checkpoint_id,
                "as_node": as_node or "",
                # Channel names are the state's structure, not its content.
                "channels": sorted(
                    key for key in (values or {}) if key in graph.channels
                )[:50],
            },
        )
    return new_id
