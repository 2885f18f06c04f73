"""Seals are HMACs under an audit key that is not in the database: someone who
can write the audit tables cannot re-seal what they changed (issue 16, 1)."""

import base64
import io

import pytest
from django.core.management import CommandError, call_command

from audit import sealing
from audit.models import AuditBlock
from runs.crypto import audit_keyring
from tests.audit.helpers import add_events, reseal, tamper
from tests.deployment.processes import manage, production_env
from tests.factories import make_tenant

pytestmark = pytest.mark.django_db

AUDIT_1 = "audit-1:dGVzdC1hdWRpdC1rZXktbnVtYmVyLW9uZS0zMmJ5dCE="
AUDIT_0 = "audit-0:dGVzdC1hdWRpdC1rZXktbnVtYmVyLXplcm8tMzJieSE="


def verify(tenant) -> sealing.ChainCheck:
    return sealing.verify_tenant(tenant_id=tenant.pk)


@pytest.fixture
def sealed_tenant():
    tenant = make_tenant()
    add_events(tenant, 40)
    sealing.seal_all()
    add_events(tenant, 10)
    sealing.seal_all()
    assert verify(tenant).ok
    return tenant


def reattribute(tenant, seq: int) -> None:
    """The finding's forgery: a decision handed to another reviewer."""
    tamper(
        "UPDATE audit_auditevent SET actor_type = 'user', actor_id = '99', "
        "actor_label = 'someone-else' WHERE tenant_id = %s AND seq = %s",
        [tenant.pk, seq],
    )


def test_blocks_are_sealed_under_the_active_audit_key(sealed_tenant):
    blocks = AuditBlock.objects.for_tenant(sealed_tenant).order_by("first_seq")
    assert [block.key_id for block in blocks] == ["audit-1", "audit-1"]
    assert blocks[1].prev_hash == blocks[0].block_hash


def test_a_rewrite_resealed_with_the_published_formulas_is_detected(sealed_tenant):
    reattribute(sealed_tenant, 7)
    reseal(sealed_tenant)  # the unkeyed SHA-256 that used to pass
    check = verify(sealed_tenant)
    assert not check.ok and check.first_bad_seq == 1
    assert "without an audit key" in check.problem


def test_a_rewrite_resealed_under_a_guessed_key_is_detected(sealed_tenant):
    reattribute(sealed_tenant, 45)
    reseal(sealed_tenant, key=b"\0" * 32, key_id="audit-1")
    check = verify(sealed_tenant)
    assert not check.ok and check.first_bad_seq == 1
    assert check.problem == "block #1-41 was altered after sealing"


def test_a_rewrite_resealed_under_the_audit_key_passes_without_a_saved_head(
    sealed_tenant,
):
    """The limit that saved heads close (tests/audit/test_anchor.py): whoever
    holds the audit key can seal a rewritten history."""
    reattribute(sealed_tenant, 7)
    reseal(sealed_tenant, key=audit_keyring().key("audit-1"), key_id="audit-1")
    assert verify(sealed_tenant).ok


def test_old_blocks_verify_under_their_key_after_rotation(settings):
    settings.GATEHOUSE_AUDIT_KEYS = AUDIT_0
    tenant = make_tenant()
    add_events(tenant, 5)
    sealing.seal_all()
    settings.GATEHOUSE_AUDIT_KEYS = f"{AUDIT_1},{AUDIT_0}"  # rotated: audit-1 seals
    add_events(tenant, 5)
    sealing.seal_all()
    keys = AuditBlock.objects.for_tenant(tenant).order_by("first_seq")
    assert [block.key_id for block in keys] == ["audit-0", "audit-1"]
    assert verify(tenant).ok

    settings.GATEHOUSE_AUDIT_KEYS = AUDIT_1  # audit-0 left the ring too early
    check = verify(tenant)
    assert not check.ok and check.first_bad_seq == 1
    assert "audit key 'audit-0', which is not in GATEHOUSE_AUDIT_KEYS" in check.problem


def test_verify_audit_names_a_reattributed_event(sealed_tenant):
    reattribute(sealed_tenant, 12)
    out = io.StringIO()
    with pytest.raises(CommandError, match="1 audit chain"):
        call_command("verify_audit", "--tenant", sealed_tenant.slug, stdout=out)
    assert "BROKEN at seq 12: event #12 does not match its sealed digest" in (
        out.getvalue()
    )


def test_a_malformed_audit_key_ring_is_refused():
    short = base64.b64encode(b"short").decode()
    result = manage("check", env=production_env(GATEHOUSE_AUDIT_KEYS=f"a1:{short}"))
    assert result.returncode != 0
    assert "GATEHOUSE_AUDIT_KEYS key 'a1' must be 32 bytes" in result.stderr
