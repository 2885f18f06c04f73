"""record(): the one way anything writes to the audit trail; and the trail's own
use cases: tombstones of deleted threads, the retention purge, verification."""

from __future__ import annotations

import datetime
import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache, partial
from typing import Any

from django.db import DatabaseError, DataError, connection, models, transaction
from django.db.models import F, Value
from django.db.models.functions import Coalesce, Greatest
from django.utils import timezone

from audit import anchors, events, sealing, selectors
from audit.models import (
    ActorType,
    AuditBlock,
    AuditChainHead,
    AuditEvent,
    AuditSequence,
    AuditVerification,
)
from audit.redaction import clean_data
from audit.signals import event_recorded
from runs.models import Tenant

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Actor:
    """Who did something, with a label that still reads after they are gone.

    `on_behalf_of` is what a service key said it acted for (a chat bot naming
    a reviewer): unverified, so it is labelled as such, never as a person.
    A person using their personal key is a user actor, "via key <prefix>".
    """

    type: str
    id: str = ""
    label: str = ""
    on_behalf_of: str = ""

    @classmethod
    def system(cls, label: str = "system") -> Actor:
        return cls(type=ActorType.SYSTEM, id="", label=label)

    @classmethod
    def user(cls, user: Any, via_key: Any = None) -> Actor:
        label = user.get_username()
        if via_key is not None:
            label += f" via key {via_key.prefix}"
        return cls(type=ActorType.USER, id=str(user.pk), label=label[:200])

    @classmethod
    def api_key(cls, api_key: Any, on_behalf_of: str = "") -> Actor:
        label = f"key {api_key.prefix} ({api_key.name})"
        if on_behalf_of:
            label += f", unverified label {on_behalf_of}"
        return cls(
            type=ActorType.API_KEY,
            id=str(api_key.pk),
            label=label[:200],
            on_behalf_of=on_behalf_of[:200],
        )

    @classmethod
    def agent(cls, name: str) -> Actor:
        return cls(type=ActorType.AGENT, id=name, label=f"agent {name}")


# The tenants whose sequence row this process saw committed: the row is
# never deleted (it PROTECTs its tenant), so a statement in a transaction
# may rely on it being there (record_with_write).
_SEQUENCED: set[int] = set()


def _next_seq(tenant_id: int, now: datetime.datetime) -> tuple[int, datetime.datetime]:
    """The tenant's next sequence number and the event's time.

    The UPDATE takes the tenant's sequence row lock, held until commit: that
    is what makes committed numbers gap-free (see AuditSequence). The time is
    `now`, or the previous event's time if a clock went back (another server,
    an NTP step), so that time order and sequence order never disagree.
    """
    sequences = AuditSequence.objects.filter(tenant_id=tenant_id)
    for _attempt in range(2):
        if connection.vendor == "postgresql":
            # One statement: bump, clamp and read back (GREATEST skips NULL).
            table = connection.ops.quote_name(AuditSequence._meta.db_table)
            with connection.cursor() as cursor:
                cursor.execute(
                    f"UPDATE {table} SET last_seq = last_seq + 1, "
                    "last_at = GREATEST(last_at, %s) WHERE tenant_id = %s "
                    "RETURNING last_seq, last_at",
                    [now, tenant_id],
                )
                row = cursor.fetchone()
        else:
            bumped = sequences.update(
                last_seq=F("last_seq") + 1,
                last_at=Greatest(Coalesce("last_at", Value(now)), Value(now)),
            )
            row = sequences.values_list("last_seq", "last_at").get() if bumped else None
        if row is not None:
            return row
        # The tenant's first event. Two first events may race here; the
        # conflict-ignoring insert lets both go on to the UPDATE.
        _sequence_row_create(tenant_id)
    raise RuntimeError(f"no audit sequence row for tenant {tenant_id}")


def _event(
    *,
    tenant: Tenant,
    kind: events.EventKind,
    actor: Actor,
    thread_id: str = "",
    run_id: str = "",
    action: str = "",
    data: dict[str, Any] | None = None,
) -> AuditEvent:
    """The unsaved event, its data checked (see record, whose keywords these
    are, and record_with_write, which passes them through)."""
    declared = events.get(kind.name)
    cleaned = clean_data(data or {})
    run_id = str(run_id) if run_id else ""
    context = {
        "thread_id": thread_id,
        "run_id": run_id,
        "action": action,
        "actor": actor.label,
        **cleaned,
    }
    summary = declared.summarise(**context)
    values = {
        "id": None,
        "tenant_id": tenant.pk,
        # Both given by the insert that numbers the event.
        "seq": None,
        "occurred_at": None,
        "actor_type": actor.type,
        "actor_id": str(actor.id)[:64],
        "actor_label": actor.label[:200],
        "actor_on_behalf_of": actor.on_behalf_of[:200],
        "kind": declared.name,
        "thread_id": thread_id,
        "run_id": run_id,
        "action": action[:100],
        "summary": summary[:500],
        "data": cleaned,
    }
    # Built from its columns in order, as Django builds a row it read: the
    # keyword path (each field found by name, the relation's checks) was most
    # of an event's construction, on every event. A column added to the
    # model and not to `values` is a KeyError here, never a silent default.
    event = AuditEvent(*(values[name] for name in _event_columns()))
    AuditEvent.tenant.field.set_cached_value(event, tenant)  # as tenant= does
    return event


@cache
def _event_columns() -> tuple[str, ...]:
    return tuple(field.attname for field in AuditEvent._meta.concrete_fields)


def record(
    *,
    tenant: Tenant,
    kind: events.EventKind,
    actor: Actor,
    thread_id: str = "",
    run_id: str = "",
    action: str = "",
    data: dict[str, Any] | None = None,
) -> AuditEvent:
    """Append an event to the tenant's trail inside the caller's transaction.

    Call it last in a service's transaction: the tenant's sequence row stays
    locked until that transaction commits. `data` must follow the rule on
    personal data in audit/events.py; a breach raises ValueError.
    """
    event = _event(
        tenant=tenant,
        kind=kind,
        actor=actor,
        thread_id=thread_id,
        run_id=run_id,
        action=action,
        data=data,
    )
    # No savepoint of its own: an event that cannot be written must undo what
    # it records, so its failure is the caller's transaction's failure.
    with transaction.atomic(savepoint=False):
        _insert(event)
    return event


def _insert(event: AuditEvent) -> None:
    """Number and insert the event, in the caller's transaction."""
    if connection.vendor == "postgresql":
        _insert_sequenced(event, timezone.now())
    else:
        event.seq, event.occurred_at = _next_seq(event.tenant_id, timezone.now())
        event.save(force_insert=True)
    _announce_on_commit(event)


def _announce_on_commit(event: AuditEvent) -> None:
    batch = _announcing()
    event._announced_with = batch
    # Every event closes its batch before it is announced: whichever
    # savepoint rolls back, the commit that announces it ends its batch first.
    announce = partial(_close_and_announce, batch, event)
    held = getattr(_held, "announcements", None)
    if held is not None and connection.get_autocommit():
        held.append(announce)  # committed: announced when the hold ends
        return
    transaction.on_commit(announce, robust=True)


_held = threading.local()


@contextmanager
def announcements_held() -> Iterator[None]:
    """The announcements of the events recorded inside in autocommit, where
    each would be made as its statement returns, made when this ends: after
    what the caller does first with what it committed (a run's end event to
    its waiting clients, which runs.wakeups orders first after a commit),
    whatever it raises. Each as on_commit(robust=True) would: a receiver's
    error is logged."""
    previous = getattr(_held, "announcements", None)
    held: list[Callable[[], None]] = []
    _held.announcements = held
    try:
        yield
    finally:
        _held.announcements = previous
        for announce in held:
            try:
                announce()
            except Exception:
                logger.exception("audit event: announcing it failed")


def _close_and_announce(batch: _Batch, event: AuditEvent) -> None:
    batch.close()
    announce_event(event)


Write = tuple[str, Sequence[Any]]


def record_with_write(
    *writes: Write,
    then: Sequence[dict[str, Any]] = (),
    chained: bool = False,
    **about: Any,
) -> tuple[AuditEvent | None, list[tuple]]:
    """Run `writes` (each SQL and its parameters: an INSERT, UPDATE or DELETE
    with a RETURNING clause) and record the event they are about (`about`:
    record()'s keywords), atomically:
    the event and the rows the first write returned. `then`: the keywords
    of further events of the same tenant, recorded after it (numbered next,
    in order) with it, in its statement; none of them if it records none.
    One write that returns no row records nothing and uses no number:
    (None, []); with several,
    each must return a row (DatabaseError otherwise, like a save that finds
    no row, with the caller's transaction marked to roll back, so a caller
    that catches it still commits none of them), and they need a
    transaction, the caller's. A write without RETURNING: ValueError. Several writes
    write distinct rows: of two updates of one row in one statement,
    Postgres applies one.

    On Postgres one statement does it all: the writes, then the bump of the
    tenant's sequence and the event's insert, as record() does them. In
    autocommit that is one round trip where a transaction of its own costs
    four (BEGIN, the write, the event, COMMIT); in a caller's transaction,
    one where there were several, and it holds the sequence row until the
    transaction ends, as record() does: call it last there. Otherwise (on
    SQLite, or in a transaction before this process saw the tenant's
    sequence row committed: see _SEQUENCED) the writes and then record().

    `chained` (Postgres): each write after the first writes only where the
    first did, its condition reading the first's rows (`EXISTS (SELECT 1
    FROM w0)`), so that in autocommit too the writes are one statement, and
    no caller's transaction is needed: the statement fails whole (nothing
    written) if the first wrote and the event was not inserted, whatever
    the reason (the others finding no row among them).
    """
    for sql, _ in writes:
        if "RETURNING" not in sql.upper():
            # "No row returned" must mean "nothing written": a write that
            # cannot return (or SQLite before 3.35 dropping RETURNING from a
            # compiled insert) would commit without its event.
            raise ValueError(f"record_with_write needs RETURNING: {sql[:80]}")
    event = _event(**about)  # record()'s keywords
    tenant = event.tenant
    further = [_event(**keywords) for keywords in then]
    if any(other.tenant_id != event.tenant_id for other in further):
        raise ValueError("record_with_write records events of one tenant")
    autocommit = connection.get_autocommit()
    if chained and connection.vendor != "postgresql":
        raise ValueError("chained writes are one Postgres statement")
    if (
        connection.vendor != "postgresql"
        or (autocommit and len(writes) > 1 and not chained)
        or (not autocommit and tenant.pk not in _SEQUENCED)
    ):
        with transaction.atomic(savepoint=False):
            returned = []
            with connection.cursor() as cursor:
                for sql, params in writes:
                    cursor.execute(sql, params)
                    returned.append(cursor.fetchall())
            if not all(returned):
                if len(writes) > 1:
                    raise _partial_write()
                return None, []
            for recorded in (event, *further):
                _insert(recorded)
        return event, returned[0]
    sql, fields = _writes_and_insert_sequenced_statement(
        tuple(sql for sql, _ in writes), 1 + len(further), chained=chained
    )
    now = timezone.now()
    params = [
        *(param for _, params in writes for param in params),
        *_sequenced_params(event, now, fields),
        *(
            param
            for other in further
            for param in _sequenced_params(other, now, fields)[2:]
        ),
    ]
    for _attempt in range(2):
        try:
            with connection.cursor() as cursor:
                cursor.execute(sql, params)
                rows = cursor.fetchall()
        except DataError as error:
            if not (autocommit and _no_sequence_row(error)):
                raise
            # The tenant's first event: the statement failed whole rather
            # than write without its event.
            _sequence_row_create(tenant.pk)
            continue
        if len(writes) > 1 and not chained and (not rows or rows[0][0] is None):
            raise _partial_write()
        if not rows:
            return None, []
        if autocommit:
            _SEQUENCED.add(tenant.pk)
        # One row per event and row of the first write, by number (see
        # _writes_and_insert_sequenced_statement).
        per_event = len(rows) // (1 + len(further))
        for recorded, row in zip((event, *further), rows[::per_event], strict=True):
            _inserted(recorded, row[:3])
            _announce_on_commit(recorded)
        return event, [row[4:] for row in rows[:per_event]]
    if chained:
        raise ChainedWriteMissed("a chained write returned no row: nothing written")
    raise RuntimeError(f"no audit sequence row for tenant {tenant.pk}")


class ChainedWriteMissed(DatabaseError):
    """record_with_write(chained=True): the first write wrote and the event
    was not inserted (a later write found no row); the statement failed
    whole, nothing was written."""


def _partial_write() -> DatabaseError:
    """The error of several writes one of which found no row, with the
    caller's transaction marked to roll back: the others wrote without their
    event, and must not commit even if the caller catches the error."""
    if connection.in_atomic_block:
        transaction.set_rollback(True)
    else:  # a transaction the caller opened without atomic()
        connection.rollback()
    return DatabaseError("a write of several returned no row")


class _Batch:
    """The events one transaction recorded, announced after its commit:
    receivers look up what they need once for all of them (once_per_commit)."""

    __slots__ = ("closed", "memo")

    def __init__(self) -> None:
        self.closed = False
        self.memo: dict[Any, Any] = {}

    def close(self) -> None:
        self.closed = True


def _announcing() -> _Batch:
    """The batch of the connection's current transaction. One whose
    transaction rolled back stays open for the next: none of its events is
    ever announced, so that transaction's events are alone in it."""
    batch = getattr(connection, "_gatehouse_audit_batch", None)
    if batch is None or batch.closed:
        batch = _Batch()
        connection._gatehouse_audit_batch = batch
    return batch


def once_per_commit(event: AuditEvent, key: Any, compute: Callable[[], Any]) -> Any:
    """`compute()`, for a receiver of event_recorded: once for all the events
    of the transaction that committed `event` (a webhook receiver looks up
    the tenant's subscriptions once per commit, not once per event). Called
    again for an event that record() did not announce."""
    batch = getattr(event, "_announced_with", None)
    if batch is None:
        return compute()
    if key not in batch.memo:
        batch.memo[key] = compute()
    return batch.memo[key]


def _sequenced_fields() -> tuple[models.Field, ...]:
    return tuple(
        f
        for f in AuditEvent._meta.concrete_fields
        if f.name not in ("id", "seq", "occurred_at")
    )


# The bump of the tenant's sequence (the row stays locked until commit, the
# time never goes back) and the insert reading from it, as CTEs `s` and the
# statement's end; `{when}` adds a condition to the bump.
_BUMP = (
    "s AS (UPDATE {sequences} SET last_seq = last_seq + {count}, "
    "last_at = GREATEST(last_at, %s) WHERE tenant_id = %s{when} "
    "RETURNING last_seq, last_at)"
)
_INSERT = (
    "INSERT INTO {events} (seq, occurred_at, {columns}) "
    "{selects} RETURNING id, seq, occurred_at"
)
_SELECT = "SELECT s.last_seq{minus}, s.last_at, {values} FROM s"


def _sequenced_parts(
    when: str = "", count: int = 1
) -> tuple[str, str, tuple[models.Field, ...]]:
    """The bump by `count` and the insert of `count` events numbered up to
    the sequence's new last, in the order of their parameters."""
    fields = _sequenced_fields()
    quote = connection.ops.quote_name
    bump = _BUMP.format(
        sequences=quote(AuditSequence._meta.db_table), count=count, when=when
    )
    values = ", ".join(["%s"] * len(fields))
    selects = " UNION ALL ".join(
        _SELECT.format(
            minus=f" - {count - 1 - i}" if i < count - 1 else "", values=values
        )
        for i in range(count)
    )
    insert = _INSERT.format(
        events=quote(AuditEvent._meta.db_table),
        columns=", ".join(quote(f.column) for f in fields),
        selects=selects,
    )
    return bump, insert, fields


@cache
def _insert_sequenced_statement() -> tuple[str, tuple[models.Field, ...]]:
    bump, insert, fields = _sequenced_parts()
    return f"WITH {bump} {insert}", fields


@cache
def _writes_and_insert_sequenced_statement(
    writes: tuple[str, ...], count: int = 1, chained: bool = False
) -> tuple[str, tuple[models.Field, ...]]:
    """The writes as CTEs `w0`, `w1`...; the bump only if each returned a row
    (a write that changed nothing uses no number); then the event's columns,
    a check, and the first write's rows; with `count` events, each event's
    columns with each of those rows, by the events' numbers.

    The check is a division by zero where every write returned rows and no
    event was inserted (the tenant has no sequence row yet): the statement
    fails whole instead of writing without its event; `chained`
    (record_with_write), wherever the first write returned rows and no
    event was inserted."""
    names = [f"w{i}" for i in range(len(writes))]
    wrote = " AND ".join(f"EXISTS (SELECT 1 FROM {name})" for name in names)
    # Where the check applies: every write wrote (chained: the first did).
    checked = "EXISTS (SELECT 1 FROM w0)" if chained else wrote
    bump, insert, fields = _sequenced_parts(when=f" AND {wrote}", count=count)
    ctes = ", ".join(
        f"{name} AS ({write})" for name, write in zip(names, writes, strict=True)
    )
    sql = (
        f"WITH {ctes}, {bump}, e AS ({insert}) "
        f"SELECT e.id, e.seq, e.occurred_at, 1 / (e.id IS NOT NULL OR NOT ({checked}))::int, "
        "w0.* FROM w0 LEFT JOIN e ON true"
    )
    if count > 1:
        sql += " ORDER BY e.seq"
    return sql, fields


def _no_sequence_row(error: DataError) -> bool:
    cause = error.__cause__
    return getattr(cause, "sqlstate", None) == "22012"  # division_by_zero


def _sequenced_params(
    event: AuditEvent, now: datetime.datetime, fields: tuple[models.Field, ...]
) -> list[Any]:
    params = [now, event.tenant_id]
    for field in fields:
        value = getattr(event, field.attname)
        # A plain CharField saves a str as it is (Field.get_db_prep_value of
        # get_prep_value, whose to_python returns it): the calls that say so
        # were a good part of an event's parameters. Other values (an enum's
        # member, the data's dict, the tenant's key) take them.
        if type(value) is not str or type(field) is not models.CharField:
            value = field.get_db_prep_save(value, connection)
        params.append(value)
    return params


def _insert_sequenced(event: AuditEvent, now: datetime.datetime) -> None:
    """Number and insert an event in one statement (Postgres).

    The same bump as `_next_seq` (the sequence row stays locked until commit,
    the time never goes back), and the insert reading from it: one round trip
    per event instead of two.
    """
    sql, fields = _insert_sequenced_statement()
    params = _sequenced_params(event, now, fields)
    for _attempt in range(2):
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            row = cursor.fetchone()
        if row is not None:
            _inserted(event, row)
            if event.tenant_id not in _SEQUENCED:
                transaction.on_commit(partial(_SEQUENCED.add, event.tenant_id))
            return
        _sequence_row_create(event.tenant_id)  # the tenant's first event
    raise RuntimeError(f"no audit sequence row for tenant {event.tenant_id}")


def _inserted(event: AuditEvent, row: Sequence[Any]) -> None:
    """The event as saved, from its insert's RETURNING id, seq, occurred_at."""
    event.pk, event.seq, event.occurred_at = row
    event._state.adding = False
    event._state.db = connection.alias


def _sequence_row_create(tenant_id: int) -> None:
    """The tenant's sequence row, for its first event: the statement that
    found none is then run again. Two first events may race here; the
    conflict-ignoring insert lets both go on."""
    AuditSequence.objects.bulk_create(
        [AuditSequence(tenant_id=tenant_id)], ignore_conflicts=True
    )


def announce_event(event: AuditEvent) -> None:
    """Send audit.signals.event_recorded for a committed event (the on-commit
    callback that record() registers)."""
    for receiver, outcome in event_recorded.send_robust(sender=AuditEvent, event=event):
        if isinstance(outcome, Exception):
            logger.error(
                "audit event %s: receiver %s failed: %r", event.pk, receiver, outcome
            )


def thread_tombstone_record(
    *,
    tenant: Tenant,
    thread_id: str,
    actor: Actor,
    requested_by: Actor,
    deletion_request_id: str | int = "",
    requested_at: datetime.datetime | None = None,
    removed: Mapping[str, int] | None = None,
) -> AuditEvent:
    """The tombstone of a deleted thread: what, when, on whose request.

    `removed` counts what went (`{"checkpoints": 12, "runs": 3}`); no content
    of the thread is ever passed here. Call it in the deletion's transaction.
    """
    data: dict[str, Any] = {
        "requested_by": requested_by.label,
        "requested_by_type": requested_by.type,
        "requested_by_id": requested_by.id,
        "deletion_request": str(deletion_request_id),
    }
    if requested_at is not None:
        data["requested_at"] = requested_at.isoformat()
    for name, count in (removed or {}).items():
        data[f"removed_{name}"] = int(count)
    return record(
        tenant=tenant,
        kind=events.THREAD_DELETED,
        actor=actor,
        thread_id=thread_id,
        action="delete",
        data=data,
    )


@dataclass(frozen=True)
class PurgeResult:
    through_seq: int
    events: int
    blocks: int
    event: AuditEvent | None


def _delete_through(tenant: Tenant, through_seq: int) -> tuple[int, int]:
    """Delete the tenant's events and blocks up to `through_seq`, the end of a
    block: (events, blocks).

    On Postgres through `audit_purge_through()`, the only way past the
    append-only triggers: a function owned by the tables' owner, which the
    application role may call but not imitate (migration 0008).
    """
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT events, blocks FROM audit_purge_through(%s, %s)",
                [tenant.pk, through_seq],
            )
            return cursor.fetchone()
    events, _ = (
        AuditEvent.objects.for_tenant(tenant).filter(seq__lte=through_seq).delete()
    )
    blocks, _ = (
        AuditBlock.objects.for_tenant(tenant).filter(last_seq__lte=through_seq).delete()
    )
    return events, blocks


@transaction.atomic
def purge_before(
    *, tenant: Tenant, before: datetime.datetime, actor: Actor | None = None
) -> PurgeResult:
    """Delete the tenant's sealed events older than `before`, by whole blocks.

    Only events covered by blocks are purged, and only whole blocks, so the
    chain stays verifiable: the purge event records the hash of the last
    removed block, which the first remaining block chains to. That event is
    itself part of the trail. Nothing is recorded when nothing was purged.
    """
    if timezone.is_naive(before):
        raise ValueError("before must be an aware datetime")
    AuditChainHead.objects.get_or_create(tenant=tenant)
    # Waits for a sealer of this tenant to finish; no new block appears while
    # the purge decides where to cut.
    AuditChainHead.objects.select_for_update().get(tenant=tenant)
    cut = selectors.purge_cut(tenant=tenant, before=before)
    if cut is None:
        start, _ = sealing.chain_start(tenant.pk)
        return PurgeResult(through_seq=start - 1, events=0, blocks=0, event=None)
    through_seq, anchor_hash = cut.through_seq, cut.anchor_hash
    purged_events, purged_blocks = _delete_through(tenant, through_seq)
    event = record(
        tenant=tenant,
        kind=events.AUDIT_PURGED,
        actor=actor or Actor.system("audit retention"),
        data={
            "through_seq": through_seq,
            "anchor_hash": anchor_hash,
            "events": purged_events,
            "blocks": purged_blocks,
            "before": before.astimezone(datetime.UTC).isoformat(),
        },
    )
    return PurgeResult(
        through_seq=through_seq,
        events=purged_events,
        blocks=purged_blocks,
        event=event,
    )


def audit_verify(
    *, tenant: Tenant, checked_by: str = "", against: anchors.SignedHead | None = None
) -> AuditVerification:
    """Recompute the tenant's chain and keep the outcome, signed, for the admin.

    With `against`, a head saved earlier (audit_anchor, /audit/head), the
    chain must still hold that very block; a head this Gatehouse did not sign
    for this tenant raises anchors.InvalidHead before anything is checked.
    """
    if against is not None:
        anchors.head_check(against, tenant=tenant)
    check = sealing.verify_tenant(
        tenant_id=tenant.pk,
        against=None if against is None else (against.head_seq, against.head_hash),
    )
    verification = AuditVerification(
        tenant=tenant,
        checked_at=timezone.now(),
        ok=check.ok,
        blocks=check.blocks,
        events=check.events,
        unsealed=check.unsealed,
        first_bad_seq=check.first_bad_seq,
        problem=check.problem[:500],
        head_seq=check.head_seq,
        head_hash=check.head_hash,
        checked_by=checked_by[:200],
        against_seq=None if against is None else against.head_seq,
        against_hash="" if against is None else against.head_hash,
    )
    anchors.verification_sign(verification)
    verification.save()
    return verification
