"""Tamper evidence: each tenant's events sealed into a chain of keyed blocks.

Every minute, `seal_all()` (the `audit.seal` beat task) takes each tenant's
committed events that no block covers yet and seals them into an `AuditBlock`:
the SHA-256 of the events' digests, the previous block's hash, and an
HMAC-SHA256 over all of it under the active audit key (`GATEHOUSE_AUDIT_KEYS`,
runs.crypto), whose id the block keeps. Changing, removing or adding an event
afterwards changes a digest, and `verify_tenant()` names the first sequence
number that no longer matches. The key never enters the database, so whoever
can write the audit tables but not read the application's configuration
cannot re-seal what they changed. Rotation: a new key seals new blocks; old
blocks verify under the key id they name, which stays in the ring.

Blocks sealed before seals were keyed (`key_id` empty, a plain SHA-256) no
longer verify: `manage.py audit_reseal_legacy` checks them once with the old
formula and re-seals them under the key (docs/audit.md).

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
import hmac
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
from runs.crypto import AUDIT_KEYS_SETTING, audit_keyring, audit_mac

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
_BLOCK_TAG = "gatehouse.audit.block.v2"
# Blocks sealed before seals were keyed: a plain SHA-256 anyone can recompute.
_LEGACY_BLOCK_TAG = "gatehouse.audit.block.v1"


def _number(text: str) -> int | float:
    # Integral numbers read back as integers however they were written: jsonb
    # turns 1e20 into 100000000000000000000 and keeps 1.0 as 1.0.
    value = float(text)
    return int(value) if value.is_integer() else value


_decode = json.JSONDecoder(parse_float=_number).decode
_encode = json.JSONEncoder(
    ensure_ascii=False, separators=(",", ":"), sort_keys=True
).encode


def utc_text(value: datetime.datetime | str) -> str:
    if isinstance(value, str):  # printed by Postgres in this very form
        return value
    return value.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def canonical(payload: list) -> bytes:
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
    payload = [_EVENT_TAG, tenant_id, seq, utc_text(occurred_at), *columns]
    payload.append(_decode(data))
    return hashlib.sha256(canonical(payload)).digest()


def _block_payload(
    tag: str,
    *,
    tenant_id: int,
    first_seq: int,
    last_seq: int,
    events_hash: str,
    leaves: bytes,
    prev_hash: str,
    sealed_at: datetime.datetime,
) -> list:
    return [
        tag,
        tenant_id,
        first_seq,
        last_seq,
        events_hash,
        hashlib.sha256(leaves).hexdigest(),
        prev_hash,
        utc_text(sealed_at),
    ]


def block_fields(block: AuditBlock) -> dict:
    """The fields of a stored block that its seal covers, as block_hash()
    and seal_problem() take them."""
    return {
        "first_seq": block.first_seq,
        "last_seq": block.last_seq,
        "events_hash": block.events_hash,
        "leaves": bytes(block.leaves),
        "prev_hash": block.prev_hash,
        "sealed_at": block.sealed_at,
    }


def block_hash(*, key_id: str, **fields) -> str:
    """A block's seal: HMAC-SHA256 under the audit key `key_id` over the
    block's fields and the key id itself.

    KeyError when the audit key ring no longer holds `key_id`.
    """
    payload = [*_block_payload(_BLOCK_TAG, **fields), key_id]
    return audit_mac(canonical(payload), key_id=key_id)


def legacy_block_hash(**fields) -> str:
    """The unkeyed hash of a block sealed before seals were keyed."""
    payload = _block_payload(_LEGACY_BLOCK_TAG, **fields)
    return hashlib.sha256(canonical(payload)).hexdigest()


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
        key_id = audit_keyring().active_id
        this_hash = block_hash(
            key_id=key_id,
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
            key_id=key_id,
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


def chain_start(tenant_id: int) -> tuple[int, str]:
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


def seal_problem(
    *, tenant_id: int, key_id: str, stored_hash: str, allow_legacy: bool, **fields
) -> str:
    """Why a block's stored seal is not what its fields give; "" if it is."""
    span = f"block #{fields['first_seq']}-{fields['last_seq']}"
    if not key_id:
        if not allow_legacy:
            return (
                f"{span} was sealed without an audit key (before seals were "
                "keyed); run manage.py audit_reseal_legacy"
            )
        recomputed = legacy_block_hash(tenant_id=tenant_id, **fields)
    else:
        try:
            recomputed = block_hash(key_id=key_id, tenant_id=tenant_id, **fields)
        except KeyError:
            return (
                f"{span} was sealed with audit key {key_id!r}, which is not in "
                f"{AUDIT_KEYS_SETTING}"
            )
    if not hmac.compare_digest(recomputed, stored_hash):
        return f"{span} was altered after sealing"
    return ""


def _check(
    tenant_id: int,
    *,
    against: tuple[int, str] | None = None,
    allow_legacy: bool = False,
) -> ChainCheck:
    start, prev_hash = chain_start(tenant_id)
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
    anchor_seq, anchor_hash = against or (None, "")
    if anchor_seq is not None and anchor_seq < start - 1:
        return result(
            anchor_seq,
            f"the saved head #{anchor_seq} was purged by retention (through "
            f"#{start - 1}); it can no longer be checked: keep a newer one",
        )
    if anchor_seq == start - 1 and not hmac.compare_digest(anchor_hash, prev_hash):
        return result(
            start, f"the chain no longer starts from the saved head #{anchor_seq}"
        )

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
            "key_id",
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
        key_id,
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
        if len(leaves) != (last - first + 1) * LEAF_BYTES:
            return result(first, f"{span} was altered after sealing")
        problem = seal_problem(
            tenant_id=tenant_id,
            key_id=key_id,
            stored_hash=stored_hash,
            allow_legacy=allow_legacy,
            first_seq=first,
            last_seq=last,
            events_hash=events_hash,
            leaves=leaves,
            prev_hash=block_prev,
            sealed_at=sealed_at,
        )
        if problem:
            return result(first, problem)
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
        if anchor_seq is not None and first <= anchor_seq <= last:
            # A saved head is the end of a block whose seal it copied: any
            # other block here means the history up to it was sealed anew.
            if anchor_seq != last or not hmac.compare_digest(anchor_hash, stored_hash):
                return result(
                    first,
                    f"{span} is not the block of the saved head #{anchor_seq}: "
                    "history up to it was rewritten and sealed again",
                )
        blocks += 1
        events_sealed += last - first + 1
        prev_hash, expected = stored_hash, last + 1
        head_seq, head_hash = last, stored_hash

    if anchor_seq is not None and anchor_seq > head_seq:
        return result(
            head_seq + 1,
            f"the sealed chain ends at #{head_seq}, before the saved head "
            f"#{anchor_seq}: sealed history was removed",
        )
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


def verify_tenant(
    *,
    tenant_id: int,
    against: tuple[int, str] | None = None,
    allow_legacy: bool = False,
) -> ChainCheck:
    """Recompute a tenant's chain from its blocks and events.

    `against` is a head saved earlier, `(head_seq, head_hash)`: the chain must
    still contain that very block, which proves that no history up to it was
    rewritten, re-sealed or removed since. `allow_legacy` accepts blocks
    sealed without a key (for audit_reseal_legacy only).

    On Postgres the check reads one REPEATABLE READ snapshot, so a seal or a
    purge that commits meanwhile cannot make a sound chain look broken.
    """
    if connection.vendor == "postgresql" and not connection.in_atomic_block:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute(
                    "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"
                )
            return _check(tenant_id, against=against, allow_legacy=allow_legacy)
    return _check(tenant_id, against=against, allow_legacy=allow_legacy)
