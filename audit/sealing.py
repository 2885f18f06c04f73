"""Tamper evidence: each tenant's events sealed into a chain of hashed blocks.

Every minute, `seal_all()` (the `audit.seal` beat task) takes each tenant's
committed events that no block covers yet and seals them into an `AuditBlock`:
the SHA-256 of the events' digests, the previous block's hash, and a hash over
all of it. Changing, removing or adding an event afterwards changes a digest,
and `verify_tenant()` names the first sequence number that no longer matches.

Why sealing never holds up the writers of events:

- `record()` allocates sequence numbers under the tenant's `AuditSequence`
  row lock, held until its transaction commits, so committed sequence numbers
  always form a gap-free prefix. The sealer only *reads* that row's committed
  value (a plain read does not wait for the lock) and seals up to it: every
  event at or below it is committed and visible.
- Two sealers exclude each other per tenant through the tenant's
  `AuditChainHead` row, locked with SKIP LOCKED: the second one skips the
  tenant instead of waiting or building an overlapping block.
- Blocks name ranges of sequence numbers; event rows are never updated.

The canonical form of an event (what its digest covers) is a compact JSON
array of a version tag, the tenant id and the event's columns (the time as
`YYYY-MM-DDTHH:MM:SS.ffffffZ`), data last with sorted keys. Integral numbers
are written as integers so that a value reads back identically whichever way
the database normalised it (jsonb turns 1e20 into 100000000000000000000).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass

from django.db import connection, transaction
from django.db.models import F, OuterRef, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.utils import timezone

from audit import events
from audit.expressions import json_text, timestamp_text
from audit.models import AuditBlock, AuditChainHead, AuditEvent, AuditSequence

logger = logging.getLogger(__name__)

GENESIS_HASH = "0" * 64
# Enough that a backlog is sealed in few blocks, small enough that one block's
# transaction stays short and its leaves stay under 80 kB.
MAX_BLOCK_EVENTS = 10_000
LEAF_BYTES = 8
HASHED_FIELDS = (
    "seq",
    "occurred_at",
    "actor_type",
    "actor_id",
    "actor_label",
    "actor_on_behalf_of",
    "kind",
    "thread_id",
    "run_id",
    "action",
    "summary",
    "data",
)
_EVENT_TAG = "gatehouse.audit.event.v1"
_BLOCK_TAG = "gatehouse.audit.block.v1"


def _number(text: str) -> int | float:
    # Integral numbers read back as integers however they were written: jsonb
    # turns 1e20 into 100000000000000000000 and keeps 1.0 as 1.0.
    value = float(text)
    return int(value) if value.is_integer() else value


_decode = json.JSONDecoder(parse_float=_number).decode
_encode = json.JSONEncoder(
    ensure_ascii=False, separators=(",", ":"), sort_keys=True
).encode


def _timestamp(value: datetime.datetime | str) -> str:
    if isinstance(value, str):  # printed by Postgres in this very form
        return value
    return value.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _canonical(payload: list) -> bytes:
    return _encode(payload).encode()


def hashed_rows(queryset: QuerySet[AuditEvent]) -> QuerySet:
    """The HASHED_FIELDS of each event, with `data` as JSON text and, on
    Postgres, `occurred_at` as text: the fast form for event_digest()."""
    return queryset.annotate(
        _at=timestamp_text("occurred_at"), _data=json_text("data")
    ).values_list("seq", "_at", *HASHED_FIELDS[2:-1], "_data")


def event_digest(tenant_id: int, row: tuple) -> bytes:
    """SHA-256 of one event, from its HASHED_FIELDS values in that order.

    `data` may be JSON text or the decoded value; either gives the digest.
    """
    seq, occurred_at, *columns, data = row
    if not isinstance(data, str):
        data = json.dumps(data)
    payload = [_EVENT_TAG, tenant_id, seq, _timestamp(occurred_at), *columns]
    payload.append(_decode(data))
    return hashlib.sha256(_canonical(payload)).digest()


def block_hash(
    *,
    tenant_id: int,
    first_seq: int,
    last_seq: int,
    events_hash: str,
    leaves: bytes,
    prev_hash: str,
    sealed_at: datetime.datetime,
) -> str:
    payload = [
        _BLOCK_TAG,
        tenant_id,
        first_seq,
        last_seq,
        events_hash,
        hashlib.sha256(leaves).hexdigest(),
        prev_hash,
        _timestamp(sealed_at),
    ]
    return hashlib.sha256(_canonical(payload)).hexdigest()


# --- Sealing ------------------------------------------------------------------


def _committed_seq(tenant_id: int) -> int:
    value = (
        AuditSequence.objects.filter(tenant_id=tenant_id)
        .values_list("last_seq", flat=True)
        .first()
    )
    return value or 0


def seal_tenant(*, tenant_id: int, max_events: int | None = None) -> int:
    """Seal the next block of a tenant's committed events; the number sealed.

    Returns 0 when there is nothing to seal or another sealer holds the
    tenant's chain head right now. A block holds at most `max_events` events
    (MAX_BLOCK_EVENTS by default).
    """
    max_events = max_events or MAX_BLOCK_EVENTS
    with transaction.atomic():
        head = (
            AuditChainHead.objects.select_for_update(skip_locked=True)
            .filter(tenant_id=tenant_id)
            .first()
        )
        if head is None:
            return 0
        upper = min(_committed_seq(tenant_id), head.last_seq + max_events)
        if upper <= head.last_seq:
            return 0
        rows = hashed_rows(
            AuditEvent.objects.filter(
                tenant_id=tenant_id, seq__gt=head.last_seq, seq__lte=upper
            ).order_by("seq")
        )
        digests: list[bytes] = []
        expected = head.last_seq + 1
        for row in rows:
            if row[0] != expected:
                # Committed numbers are gap-free, so a hole means a row was
                # removed behind the application's back: stop there, so the
                # chain never vouches for it; verify_audit names the hole.
                logger.error(
                    "audit: tenant %s has no event #%s; sealing stops there",
                    tenant_id,
                    expected,
                )
                break
            digests.append(event_digest(tenant_id, row))
            expected += 1
        if not digests:
            return 0
        first_seq = head.last_seq + 1
        last_seq = first_seq + len(digests) - 1
        events_hash = hashlib.sha256(b"".join(digests)).hexdigest()
        leaves = b"".join(digest[:LEAF_BYTES] for digest in digests)
        prev_hash = head.block_hash or GENESIS_HASH
        sealed_at = timezone.now()
        this_hash = block_hash(
            tenant_id=tenant_id,
            first_seq=first_seq,
            last_seq=last_seq,
            events_hash=events_hash,
            leaves=leaves,
            prev_hash=prev_hash,
            sealed_at=sealed_at,
        )
        AuditBlock.objects.create(
            tenant_id=tenant_id,
            first_seq=first_seq,
            last_seq=last_seq,
            events_hash=events_hash,
            leaves=leaves,
            prev_hash=prev_hash,
            block_hash=this_hash,
            sealed_at=sealed_at,
        )
        AuditChainHead.objects.filter(pk=head.pk).update(
            last_seq=last_seq, block_hash=this_hash, updated_at=sealed_at
        )
        return len(digests)


def _ensure_heads() -> None:
    missing = AuditSequence.objects.exclude(
        tenant_id__in=AuditChainHead.objects.values("tenant_id")
    ).values_list("tenant_id", flat=True)
    heads = [AuditChainHead(tenant_id=tenant_id) for tenant_id in missing]
    if heads:
        # Another sealer may create the same heads at the same moment.
        AuditChainHead.objects.bulk_create(heads, ignore_conflicts=True)


def pending_tenant_ids() -> list[int]:
    """Tenants with committed events that no block covers yet."""
    _ensure_heads()
    sealed = AuditChainHead.objects.filter(tenant_id=OuterRef("tenant_id")).values(
        "last_seq"
    )
    return list(
        AuditSequence.objects.annotate(sealed=Coalesce(Subquery(sealed), 0))
        .filter(last_seq__gt=F("sealed"))
        .order_by("tenant_id")
        .values_list("tenant_id", flat=True)
    )


@dataclass(frozen=True)
class SealReport:
    tenants: int
    blocks: int
    events: int


def seal_all(*, time_budget: float | None = None) -> SealReport:
    """Seal every tenant's backlog, one block at a time, within a time budget.

    A tenant left unfinished when the budget runs out is picked up by the next
    run; the budget keeps one beat run from overlapping the next for long.
    """
    deadline = None if time_budget is None else time.monotonic() + time_budget
    tenants = blocks = sealed = 0
    for tenant_id in pending_tenant_ids():
        tenants += 1
        while True:
            count = seal_tenant(tenant_id=tenant_id)
            if count:
                blocks += 1
                sealed += count
            if count < MAX_BLOCK_EVENTS:  # caught up (or locked by another)
                break
            if deadline is not None and time.monotonic() > deadline:
                break
        if deadline is not None and time.monotonic() > deadline:
            break
    return SealReport(tenants=tenants, blocks=blocks, events=sealed)


# --- Verification -------------------------------------------------------------


@dataclass(frozen=True)
class ChainCheck:
    ok: bool
    blocks: int
    events: int
    unsealed: int
    first_bad_seq: int | None
    problem: str
    head_seq: int
    head_hash: str


class _Rows:
    """An iterator over event rows that can look at the next one."""

    def __init__(self, rows: Iterator[tuple]) -> None:
        self._rows = rows
        self._next: tuple | None = None
        self._advance()

    def _advance(self) -> None:
        self._next = next(self._rows, None)

    def peek(self) -> tuple | None:
        return self._next

    def pop(self) -> tuple | None:
        row = self._next
        self._advance()
        return row


def _purge_anchor(tenant_id: int) -> tuple[int, str]:
    """Where the chain starts after retention purges: (first seq, prev hash)."""
    data = (
        AuditEvent.objects.filter(tenant_id=tenant_id, kind=events.AUDIT_PURGED.name)
        .order_by("-seq")
        .values_list("data", flat=True)
        .first()
    )
    if not data:
        return 1, GENESIS_HASH
    return int(data["through_seq"]) + 1, str(data["anchor_hash"])


def _check(tenant_id: int) -> ChainCheck:
    start, prev_hash = _purge_anchor(tenant_id)
    committed = _committed_seq(tenant_id)
    blocks = events_sealed = unsealed = 0
    head_seq, head_hash = start - 1, prev_hash

    def result(bad: int | None, problem: str = "") -> ChainCheck:
        return ChainCheck(
            ok=bad is None,
            blocks=blocks,
            events=events_sealed + unsealed,
            unsealed=unsealed,
            first_bad_seq=bad,
            problem=problem,
            head_seq=head_seq,
            head_hash=head_hash,
        )

    leftover = (
        AuditEvent.objects.filter(tenant_id=tenant_id, seq__lt=start)
        .order_by("seq")
        .values_list("seq", flat=True)
        .first()
    )
    if leftover is not None:
        return result(leftover, f"event #{leftover} should have been purged")

    rows = _Rows(
        hashed_rows(
            AuditEvent.objects.filter(tenant_id=tenant_id, seq__gte=start).order_by(
                "seq"
            )
        ).iterator(chunk_size=5000)
    )
    block_rows = (
        AuditBlock.objects.filter(tenant_id=tenant_id, last_seq__gte=start)
        .order_by("first_seq")
        .values_list(
            "first_seq",
            "last_seq",
            "events_hash",
            "leaves",
            "prev_hash",
            "block_hash",
            "sealed_at",
        )
        .iterator(chunk_size=200)
    )
    expected = start
    for (
        first,
        last,
        events_hash,
        leaves,
        block_prev,
        stored_hash,
        sealed_at,
    ) in block_rows:
        span = f"block #{first}-{last}"
        if first != expected:
            return result(
                min(first, expected),
                f"{span} does not follow the previous block (expected #{expected})",
            )
        if block_prev != prev_hash:
            return result(first, f"{span} does not chain to the previous block")
        leaves = bytes(leaves)
        recomputed = block_hash(
            tenant_id=tenant_id,
            first_seq=first,
            last_seq=last,
            events_hash=events_hash,
            leaves=leaves,
            prev_hash=block_prev,
            sealed_at=sealed_at,
        )
        if recomputed != stored_hash or len(leaves) != (last - first + 1) * LEAF_BYTES:
            return result(first, f"{span} was altered after sealing")
        running = hashlib.sha256()
        for index, seq in enumerate(range(first, last + 1)):
            row = rows.peek()
            if row is None or row[0] > seq:
                return result(seq, f"event #{seq} is missing from {span}")
            if row[0] < seq:
                return result(row[0], f"event #{row[0]} appears twice")
            rows.pop()
            digest = event_digest(tenant_id, row)
            offset = index * LEAF_BYTES
            if digest[:LEAF_BYTES] != leaves[offset : offset + LEAF_BYTES]:
                return result(seq, f"event #{seq} does not match its sealed digest")
            running.update(digest)
        if running.hexdigest() != events_hash:
            return result(first, f"the events of {span} do not match its hash")
        blocks += 1
        events_sealed += last - first + 1
        prev_hash, expected = stored_hash, last + 1
        head_seq, head_hash = last, stored_hash

    # Events after the last block are not sealed yet; they must still be the
    # gap-free numbers that record() handed out.
    while (row := rows.pop()) is not None:
        seq = row[0]
        if seq < expected:
            return result(seq, f"event #{seq} appears twice")
        if seq > expected:
            return result(expected, f"event #{expected} is missing")
        if seq > committed:
            return result(seq, f"event #{seq} was never handed out by record()")
        unsealed += 1
        expected += 1
    return result(None)


def verify_tenant(*, tenant_id: int) -> ChainCheck:
    """Recompute a tenant's chain from its blocks and events.

    On Postgres the check reads one REPEATABLE READ snapshot, so a seal or a
    purge that commits meanwhile cannot make a sound chain look broken.
    """
    if connection.vendor == "postgresql" and not connection.in_atomic_block:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute(
                    "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"
                )
            return _check(tenant_id)
    return _check(tenant_id)
