"""Setup helpers for the audit tests: many events fast, and raw tampering."""

from __future__ import annotations

import datetime
import hashlib
import hmac
import json
from collections.abc import Callable

from django.db import connection, transaction

from audit import sealing
from audit.models import AuditBlock, AuditEvent, AuditSequence
from runs.models import Tenant

UTC = datetime.UTC
# After every event the tests record for real (tenant and key creation), so
# that bulk events keep time order equal to sequence order, as record() does.
BASE_TIME = datetime.datetime.now(UTC).replace(microsecond=0) + datetime.timedelta(
    days=400
)


def event_fields(seq: int) -> dict:
    """The deterministic content of bulk event number `seq`."""
    return {
        "actor_type": "agent",
        "actor_id": "refund",
        "actor_label": "agent refund",
        "actor_on_behalf_of": "",
        "kind": "tenant.created",
        "thread_id": f"case-{seq % 97}",
        "run_id": f"run-{seq % 13}",
        "action": "refund_order" if seq % 2 else "",
        "summary": f'step {seq} of the refund agent, with a comma, and "quotes"',
        "data": {"step": seq, "order_id": f"A-{seq}", "amount": "40.00", "ok": True},
    }


def add_events(
    tenant: Tenant,
    count: int,
    *,
    at: Callable[[int], datetime.datetime] | None = None,
    fields: Callable[[int], dict] = event_fields,
) -> range:
    """Append `count` events after the tenant's last one, with COPY; the seqs.

    The tenant's sequence counter moves on as record() would have moved it,
    and so does its last time (when the new events are later).
    """
    with transaction.atomic():
        sequence, _ = AuditSequence.objects.select_for_update().get_or_create(
            tenant=tenant
        )
        first = sequence.last_seq + 1
        seqs = range(first, first + count)
        last_at = sequence.last_at
        columns = [
            "tenant_id",
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
        ]
        sql = f"COPY audit_auditevent ({', '.join(columns)}) FROM STDIN"
        with connection.cursor() as cursor:
            with cursor.cursor.copy(sql) as copy:
                for seq in seqs:
                    values = fields(seq)
                    when = (
                        at(seq) if at else BASE_TIME + datetime.timedelta(seconds=seq)
                    )
                    copy.write_row(
                        [
                            tenant.pk,
                            seq,
                            when,
                            values["actor_type"],
                            values["actor_id"],
                            values["actor_label"],
                            values["actor_on_behalf_of"],
                            values["kind"],
                            values["thread_id"],
                            values["run_id"],
                            values["action"],
                            values["summary"],
                            json.dumps(values["data"]),
                        ]
                    )
        AuditSequence.objects.filter(tenant=tenant).update(
            last_seq=seqs[-1], last_at=last_at
        )
    return seqs


def tamper(sql: str, params: list | None = None) -> None:
    """Run SQL as a database superuser would, with the audit triggers off
    (SQLite, the embedded mode, has none)."""
    with connection.cursor() as cursor:
        if connection.vendor != "postgresql":
            cursor.execute(sql, params or [])
            return
        cursor.execute("SET session_replication_role = replica")
        try:
            cursor.execute(sql, params or [])
        finally:
            cursor.execute("SET session_replication_role = DEFAULT")


def seqs_of(tenant: Tenant) -> list[int]:
    return list(
        AuditEvent.objects.for_tenant(tenant)
        .order_by("seq")
        .values_list("seq", flat=True)
    )


def reseal(tenant: Tenant, *, key: bytes | None = None, key_id: str = "") -> None:
    """Seal every block of the tenant again from its events as they are now,
    as someone who can write the tables and knows the published formulas
    would: an HMAC under `key` named `key_id`, or without a key the unkeyed
    SHA-256 of blocks sealed before seals were keyed."""
    prev_hash = sealing.GENESIS_HASH
    for block in AuditBlock.objects.for_tenant(tenant).order_by("first_seq"):
        rows = sealing.hashed_rows(
            AuditEvent.objects.for_tenant(tenant)
            .filter(seq__gte=block.first_seq, seq__lte=block.last_seq)
            .order_by("seq")
        )
        digests = [sealing.event_digest(tenant.pk, row) for row in rows]
        fields = {
            "tenant_id": tenant.pk,
            "first_seq": block.first_seq,
            "last_seq": block.last_seq,
            "events_hash": hashlib.sha256(b"".join(digests)).hexdigest(),
            "leaves": b"".join(d[: sealing.LEAF_BYTES] for d in digests),
            "prev_hash": prev_hash,
            "sealed_at": block.sealed_at,
        }
        if key is None:
            block_hash = sealing.legacy_block_hash(**fields)
        else:
            payload = [*sealing._block_payload(sealing._BLOCK_TAG, **fields), key_id]
            block_hash = hmac.new(
                key, sealing.canonical(payload), hashlib.sha256
            ).hexdigest()
        tamper(
            "UPDATE audit_auditblock SET events_hash = %s, leaves = %s, "
            "prev_hash = %s, block_hash = %s, key_id = %s WHERE id = %s",
            [
                fields["events_hash"],
                fields["leaves"],
                prev_hash,
                block_hash,
                key_id,
                block.pk,
            ],
        )
        prev_hash = block_hash
    tamper(
        "UPDATE audit_auditchainhead SET block_hash = %s WHERE tenant_id = %s",
        [prev_hash, tenant.pk],
    )
