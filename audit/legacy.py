"""Blocks sealed before seals were keyed: checked once, then sealed again under
the audit key (`manage.py audit_reseal_legacy`).

Those blocks carry a plain SHA-256 that anyone can recompute, so verification
no longer accepts them. Re-sealing a tenant's chain:

1. locks its chain head (sealers of the tenant wait, then carry on from the
   new head);
2. verifies the whole chain, unkeyed blocks with the old formula: only an
   intact chain is re-sealed, since sealing a tampered one again would launder
   the tampering; a broken one is reported and left exactly as it is;
3. seals every block from the first unkeyed one on again with the active audit
   key, keeping its range, events hash, leaves and time: the events and what
   they hash to do not change, only the seals and the links between them.

On Postgres the blocks table refuses UPDATE (audit/0008), so the command runs
as the tables' owner and lifts that trigger for its own transaction only.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connection, transaction

from audit import sealing
from audit.models import AuditBlock, AuditChainHead
from runs.crypto import audit_keyring

_BLOCKS_TRIGGER = "audit_auditblock_append_only"


@dataclass(frozen=True)
class Resealed:
    ok: bool
    blocks: int
    problem: str = ""
    head_seq: int = 0
    old_head_hash: str = ""
    new_head_hash: str = ""


def _blocks_trigger(enabled: bool) -> None:
    """Lift or restore the blocks table's append-only trigger. Both happen in
    one transaction, so no other session ever sees the table unguarded."""
    if connection.vendor != "postgresql":
        return
    table = AuditBlock._meta.db_table
    with connection.cursor() as cursor:
        # ALTER TABLE refuses to run while deferred foreign key checks of the
        # table's rows are pending in this transaction: run them now.
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        action = "ENABLE" if enabled else "DISABLE"
        cursor.execute(f"ALTER TABLE {table} {action} TRIGGER {_BLOCKS_TRIGGER}")


@transaction.atomic
def reseal_legacy(*, tenant_id: int) -> Resealed:
    """Check the tenant's chain and seal its unkeyed blocks (and every block
    after them) again under the active audit key."""
    AuditChainHead.objects.select_for_update().filter(tenant_id=tenant_id).first()
    start, prev_hash = sealing.chain_start(tenant_id)
    blocks = list(
        AuditBlock.objects.filter(tenant_id=tenant_id, last_seq__gte=start).order_by(
            "first_seq"
        )
    )
    first_legacy = next((i for i, b in enumerate(blocks) if not b.key_id), None)
    if first_legacy is None:
        return Resealed(ok=True, blocks=0)
    check = sealing.verify_tenant(tenant_id=tenant_id, allow_legacy=True)
    if not check.ok:
        return Resealed(
            ok=False, blocks=0, problem=f"#{check.first_bad_seq}: {check.problem}"
        )
    if first_legacy:
        prev_hash = blocks[first_legacy - 1].block_hash
    key_id = audit_keyring().active_id
    changed = blocks[first_legacy:]
    for block in changed:
        block.prev_hash = prev_hash
        block.key_id = key_id
        block.block_hash = sealing.block_hash(
            key_id=key_id, tenant_id=tenant_id, **sealing.block_fields(block)
        )
        prev_hash = block.block_hash
    _blocks_trigger(False)
    AuditBlock.objects.bulk_update(
        changed, ["prev_hash", "key_id", "block_hash"], batch_size=500
    )
    _blocks_trigger(True)
    AuditChainHead.objects.filter(tenant_id=tenant_id).update(block_hash=prev_hash)
    return Resealed(
        ok=True,
        blocks=len(changed),
        head_seq=changed[-1].last_seq,
        old_head_hash=check.head_hash,
        new_head_hash=prev_hash,
    )
