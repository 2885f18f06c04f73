"""Sealing into hash-chained blocks, verification, tampering, the append-only
triggers and the retention purge."""

import datetime
import io

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, transaction

from audit import events, sealing
from audit.models import AuditBlock, AuditEvent
from audit.services import Actor, purge_before, record
from tests.audit.helpers import BASE_TIME, add_events, tamper
from tests.factories import make_tenant

pytestmark = pytest.mark.django_db


def blocks_of(tenant) -> list[tuple[int, int]]:
    return list(
        AuditBlock.objects.for_tenant(tenant)
        .order_by("first_seq")
        .values_list("first_seq", "last_seq")
    )


def verify(tenant) -> sealing.ChainCheck:
    return sealing.verify_tenant(tenant_id=tenant.pk)


def test_sealing_chains_each_tenants_new_events_into_blocks():
    tenant_a, tenant_b = make_tenant(), make_tenant()
    add_events(tenant_a, 10)
    report = sealing.seal_all()
    assert (report.tenants, report.blocks, report.events) == (2, 2, 12)
    add_events(tenant_a, 5)
    sealing.seal_all()
    assert blocks_of(tenant_a) == [(1, 11), (12, 16)]
    assert blocks_of(tenant_b) == [(1, 1)]
    first, second = AuditBlock.objects.for_tenant(tenant_a).order_by("first_seq")
    assert first.prev_hash == sealing.GENESIS_HASH
    assert second.prev_hash == first.block_hash
    assert len(bytes(second.leaves)) == 5 * sealing.LEAF_BYTES


def test_sealing_with_nothing_new_makes_no_block():
    tenant = make_tenant()
    sealing.seal_all()
    assert sealing.seal_all().blocks == 0
    assert blocks_of(tenant) == [(1, 1)]


def test_a_backlog_is_sealed_in_bounded_blocks(monkeypatch):
    monkeypatch.setattr(sealing, "MAX_BLOCK_EVENTS", 100)
    tenant = make_tenant()
    add_events(tenant, 249)
    sealing.seal_all()
    assert blocks_of(tenant) == [(1, 100), (101, 200), (201, 250)]


def test_an_intact_chain_verifies():
    tenant = make_tenant()
    add_events(tenant, 50)
    sealing.seal_all()
    record(tenant=tenant, kind=events.TENANT_CREATED, actor=Actor.system(),
           data={"slug": "late"})  # fmt: skip
    check = verify(tenant)
    assert check.ok and check.first_bad_seq is None
    assert (check.blocks, check.events, check.unsealed) == (1, 52, 1)
    assert check.head_seq == 51


def test_values_read_back_identically_whatever_the_database_normalised():
    """jsonb turns 1e20 into an integer and reorders keys; digests still match."""
    tenant = make_tenant()
    record(tenant=tenant, kind=events.TENANT_CREATED, actor=Actor.system(),
           data={"slug": "x", "big": 1e20, "half": 0.5, "z": 1, "a": [1.0, "é"]})  # fmt: skip
    sealing.seal_all()
    assert verify(tenant).ok


# --- Tampering ---------------------------------------------------------------


@pytest.fixture
def sealed_tenant():
    tenant = make_tenant()
    add_events(tenant, 60)
    sealing.seal_all()
    add_events(tenant, 20)
    sealing.seal_all()
    assert blocks_of(tenant) == [(1, 61), (62, 81)]
    return tenant


def test_an_edited_event_is_named(sealed_tenant):
    tamper(
        "UPDATE audit_auditevent SET summary = 'nothing to see' "
        "WHERE tenant_id = %s AND seq IN (40, 70)",
        [sealed_tenant.pk],
    )
    check = verify(sealed_tenant)
    assert not check.ok and check.first_bad_seq == 40
    assert "#40" in check.problem


def test_an_edited_timestamp_or_data_is_named(sealed_tenant):
    tamper(
        'UPDATE audit_auditevent SET data = data || \'{"amount": "4000.00"}\' '
        "WHERE tenant_id = %s AND seq = 65",
        [sealed_tenant.pk],
    )
    assert verify(sealed_tenant).first_bad_seq == 65
    tamper(
        "UPDATE audit_auditevent SET occurred_at = occurred_at + interval '1 hour' "
        "WHERE tenant_id = %s AND seq = 7",
        [sealed_tenant.pk],
    )
    assert verify(sealed_tenant).first_bad_seq == 7


def test_a_deleted_event_is_named(sealed_tenant):
    tamper(
        "DELETE FROM audit_auditevent WHERE tenant_id = %s AND seq = 33",
        [sealed_tenant.pk],
    )
    check = verify(sealed_tenant)
    assert check.first_bad_seq == 33 and "missing" in check.problem


def test_a_deleted_unsealed_event_is_named_and_not_sealed_over(sealed_tenant):
    add_events(sealed_tenant, 5)  # 82..86, not sealed yet
    tamper(
        "DELETE FROM audit_auditevent WHERE tenant_id = %s AND seq = 84",
        [sealed_tenant.pk],
    )
    assert verify(sealed_tenant).first_bad_seq == 84
    sealing.seal_all()  # seals 82..83 and stops at the hole
    assert blocks_of(sealed_tenant)[-1] == (82, 83)
    assert verify(sealed_tenant).first_bad_seq == 84


def test_an_inserted_event_is_named(sealed_tenant):
    """A row slipped in after the last number record() handed out."""
    tamper(
        "INSERT INTO audit_auditevent (tenant_id, seq, occurred_at, actor_type, "
        "actor_id, actor_label, actor_on_behalf_of, kind, thread_id, run_id, "
        "action, summary, data) VALUES (%s, 82, now(), 'user', '1', 'rita', '', "
        "'tenant.created', '', '', '', 'forged', '{}')",
        [sealed_tenant.pk],
    )
    check = verify(sealed_tenant)
    assert check.first_bad_seq == 82 and "never handed out" in check.problem
    sealing.seal_all()
    assert blocks_of(sealed_tenant)[-1] == (62, 81)  # the forgery is not sealed


def test_an_event_replaced_inside_a_sealed_range_is_named(sealed_tenant):
    tamper(
        "DELETE FROM audit_auditevent WHERE tenant_id = %s AND seq = 12",
        [sealed_tenant.pk],
    )
    tamper(
        "INSERT INTO audit_auditevent (tenant_id, seq, occurred_at, actor_type, "
        "actor_id, actor_label, actor_on_behalf_of, kind, thread_id, run_id, "
        "action, summary, data) VALUES (%s, 12, now(), 'user', '1', 'rita', '', "
        "'tenant.created', '', '', '', 'forged', '{}')",
        [sealed_tenant.pk],
    )
    assert verify(sealed_tenant).first_bad_seq == 12


def test_an_altered_block_is_detected(sealed_tenant):
    tamper(
        "UPDATE audit_auditblock SET sealed_at = sealed_at - interval '1 day' "
        "WHERE tenant_id = %s AND first_seq = 62",
        [sealed_tenant.pk],
    )
    check = verify(sealed_tenant)
    assert check.first_bad_seq == 62 and "altered" in check.problem


def test_a_deleted_block_is_detected(sealed_tenant):
    tamper(
        "DELETE FROM audit_auditblock WHERE tenant_id = %s AND first_seq = 1",
        [sealed_tenant.pk],
    )
    assert verify(sealed_tenant).first_bad_seq == 1


def test_verify_audit_command_names_the_first_bad_seq(sealed_tenant):
    other = make_tenant()
    tamper(
        "UPDATE audit_auditevent SET actor_label = 'someone else' "
        "WHERE tenant_id = %s AND seq = 21",
        [sealed_tenant.pk],
    )
    out = io.StringIO()
    with pytest.raises(CommandError, match="1 audit chain"):
        call_command("verify_audit", "--seal", stdout=out)
    text = out.getvalue()
    assert f"{sealed_tenant.slug}: BROKEN at seq 21" in text
    assert f"{other.slug}: intact" in text
    assert sealed_tenant.audit_verifications.get().first_bad_seq == 21


def test_verify_audit_command_for_one_tenant():
    tenant = make_tenant()
    out = io.StringIO()
    call_command("verify_audit", "--tenant", tenant.slug, stdout=out)
    assert out.getvalue().startswith(f"{tenant.slug}: intact: 0 block(s), 1 event")
    with pytest.raises(CommandError, match="no tenant"):
        call_command("verify_audit", "--tenant", "ghost", stdout=out)


# --- The append-only triggers --------------------------------------------------


def test_the_database_refuses_to_update_or_delete_events():
    tenant = make_tenant()
    sealing.seal_all()
    events_of = AuditEvent.objects.for_tenant(tenant)
    for change in (
        lambda: events_of.update(summary="rewritten"),
        lambda: events_of.delete(),
        lambda: AuditBlock.objects.for_tenant(tenant).update(prev_hash="0"),
        lambda: AuditBlock.objects.for_tenant(tenant).delete(),
    ):
        with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
            change()
    assert events_of.get().summary == f"tenant {tenant.slug} created"


# --- The retention purge -------------------------------------------------------


def days(n: int) -> datetime.timedelta:
    return datetime.timedelta(days=n)


def test_purge_removes_old_sealed_blocks_and_leaves_a_verifiable_record(monkeypatch):
    monkeypatch.setattr(sealing, "MAX_BLOCK_EVENTS", 10)
    tenant = make_tenant()
    # 1 is the tenant's creation; 2..41 follow, one a day from BASE_TIME.
    add_events(tenant, 40, at=lambda seq: BASE_TIME + days(seq))
    sealing.seal_all()  # blocks 1-10, 11-20, 21-30, 31-40, 41-41
    assert verify(tenant).ok

    result = purge_before(
        tenant=tenant, before=BASE_TIME + days(25), actor=Actor.system("retention")
    )
    # Events 1..24 are older than day 25, but only whole blocks go: 1-20.
    assert (result.through_seq, result.events, result.blocks) == (20, 20, 2)
    assert AuditEvent.objects.for_tenant(tenant).order_by("seq").first().seq == 21
    assert result.event.kind == "audit.purged" and result.event.seq == 42
    assert result.event.summary.startswith("audit events up to #20 purged (20")
    check = verify(tenant)
    assert check.ok, check.problem
    assert (check.blocks, check.events) == (3, 22)
    sealing.seal_all()  # the purge's own record is sealed like any event
    assert verify(tenant).ok
    # The lifted trigger was for the purge's transaction only.
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        AuditEvent.objects.for_tenant(tenant).filter(seq=21).delete()


def test_purging_twice_chains_through_both_records(monkeypatch):
    monkeypatch.setattr(sealing, "MAX_BLOCK_EVENTS", 10)
    tenant = make_tenant()
    add_events(tenant, 39, at=lambda seq: BASE_TIME + days(seq))
    sealing.seal_all()
    assert purge_before(tenant=tenant, before=BASE_TIME + days(15)).through_seq == 10
    sealing.seal_all()
    assert purge_before(tenant=tenant, before=BASE_TIME + days(35)).through_seq == 30
    assert verify(tenant).ok
    # Tampering with what remains is still found.
    tamper(
        "UPDATE audit_auditevent SET summary = 'x' WHERE tenant_id = %s AND seq = 35",
        [tenant.pk],
    )
    assert verify(tenant).first_bad_seq == 35


def test_purge_refuses_a_naive_time():
    with pytest.raises(ValueError, match="aware"):
        purge_before(tenant=make_tenant(), before=datetime.datetime(2026, 1, 1))


def test_trigger_is_installed_on_postgres():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tgname FROM pg_trigger WHERE tgname LIKE 'audit_%%append_only'"
        )
        names = sorted(row[0] for row in cursor.fetchall())
    assert names == [
        "audit_auditblock_append_only",
        "audit_auditevent_append_only",
        "audit_auditverification_append_only",
    ]
