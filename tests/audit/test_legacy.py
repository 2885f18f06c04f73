"""Blocks sealed before seals were keyed: refused by verification until
`audit_reseal_legacy` has checked them and sealed them again under the key."""

import io

import pytest
from django.core.management import CommandError, call_command

from audit import sealing
from audit.models import AuditBlock
from tests.audit.helpers import add_events, reseal, tamper
from tests.factories import make_tenant

pytestmark = pytest.mark.django_db


def reseal_legacy() -> str:
    out = io.StringIO()
    try:
        call_command("audit_reseal_legacy", stdout=out)
    except CommandError as error:
        return f"{out.getvalue()}EXIT 1: {error}"
    return out.getvalue()


@pytest.fixture
def upgraded_tenant():
    """Two blocks as an older Gatehouse sealed them, then one keyed block
    sealed after the upgrade onto their head."""
    tenant = make_tenant()
    add_events(tenant, 29)
    sealing.seal_all()
    add_events(tenant, 10)
    sealing.seal_all()
    reseal(tenant)  # the unkeyed formula, as before the upgrade
    add_events(tenant, 5)
    sealing.seal_all()
    keys = AuditBlock.objects.for_tenant(tenant).order_by("first_seq")
    assert [block.key_id for block in keys] == ["", "", "audit-1"]
    return tenant


def test_unkeyed_blocks_are_refused_until_sealed_again(upgraded_tenant):
    check = sealing.verify_tenant(tenant_id=upgraded_tenant.pk)
    assert not check.ok and check.first_bad_seq == 1
    assert "run manage.py audit_reseal_legacy" in check.problem


def test_reseal_legacy_seals_an_intact_chain_again_under_the_key(upgraded_tenant):
    before = sealing.verify_tenant(tenant_id=upgraded_tenant.pk, allow_legacy=True)
    output = reseal_legacy()
    assert f"{upgraded_tenant.slug}: 3 block(s) sealed again under the audit key" in (
        output
    )
    assert f"head #45 was {before.head_hash}, is now " in output
    check = sealing.verify_tenant(tenant_id=upgraded_tenant.pk)
    assert check.ok and (check.blocks, check.events) == (3, 45)
    keys = AuditBlock.objects.for_tenant(upgraded_tenant).values_list(
        "key_id", flat=True
    )
    assert set(keys) == {"audit-1"}
    assert f"{upgraded_tenant.slug}: nothing to seal again" in reseal_legacy()


def test_reseal_legacy_leaves_a_tampered_chain_as_it_is(upgraded_tenant):
    tamper(
        "UPDATE audit_auditevent SET summary = 'x' WHERE tenant_id = %s AND seq = 3",
        [upgraded_tenant.pk],
    )
    hashes = list(AuditBlock.objects.values_list("block_hash", flat=True))
    output = reseal_legacy()
    assert (
        f"{upgraded_tenant.slug}: BROKEN at #3: event #3 does not match its sealed "
        "digest; left as it is"
    ) in output
    assert output.endswith("EXIT 1: 1 chain(s) do not verify; nothing sealed there.")
    assert list(AuditBlock.objects.values_list("block_hash", flat=True)) == hashes
