"""Expiring threads past their TTL: shredded, removed, the audit trail kept."""

from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone

from approvals.models import ApprovalRequest
from audit.models import AuditEvent
from retention.jobs import job_run
from retention.models import ThreadRemoval
from retention.services import legal_hold_lift, legal_hold_place, retention_policy_set
from runs.crypto import ThreadDeleted
from runs.models import Checkpoint, Run, Thread, ToolCall
from tests.factories import make_tenant, stored_cipher
from tests.retention.helpers import TESTS, content_rows, make_thread

pytestmark = pytest.mark.django_db


def later(days: float):
    return time_machine.travel(timezone.now() + timedelta(days=days), tick=False)


def expire():
    return job_run("expire_threads", batch_size=2)


def test_a_thread_past_its_ttl_is_expired_and_its_audit_trail_survives():
    tenant = make_tenant()
    retention_policy_set(tenant=tenant, actor=TESTS, checkpoint_ttl_days=30)
    thread = make_thread(tenant, "case-1", steps=4)
    trail_before = list(
        AuditEvent.objects.for_tenant(tenant)
        .filter(thread_id="case-1")
        .values_list("seq", "kind")
    )
    assert trail_before

    with later(days=29):
        assert expire().totals["threads_expired"] == 0
    with later(days=31):
        report = expire()

    assert report.totals["threads_expired"] == 1
    assert report.totals["checkpoints"] == 4
    thread.refresh_from_db()
    assert thread.deleted_at is not None and thread.wrapped_data_key is None
    assert content_rows(thread) == {
        "checkpoints": 0,
        "channel_blobs": 0,
        "pending_writes": 0,
    }
    assert Run.objects.get(thread=thread).input is None
    assert ToolCall.objects.get(thread=thread).result is None
    approval = ApprovalRequest.objects.get(thread=thread)
    assert bytes(approval.payload) == b"" and approval.status == "cancelled"
    with pytest.raises(ThreadDeleted):
        stored_cipher(thread.pk)

    trail = list(
        AuditEvent.objects.for_tenant(tenant)
        .filter(thread_id="case-1")
        .values_list("seq", "kind")
    )
    assert trail[: len(trail_before)] == trail_before
    tombstone = AuditEvent.objects.for_tenant(tenant).get(kind="thread.deleted")
    assert tombstone.data["removed_checkpoints"] == 4
    assert tombstone.data["requested_by"] == "retention policy (checkpoint TTL)"
    assert ThreadRemoval.objects.get(thread=thread).reason == "checkpoint TTL"
    job = AuditEvent.objects.for_tenant(tenant).get(kind="retention.job_ran")
    assert job.data["job"] == "expire_threads" and job.data["threads_expired"] == 1


def test_a_thread_under_legal_hold_is_not_expired_until_the_hold_is_lifted():
    tenant = make_tenant()
    held = make_thread(tenant, "held", steps=2)
    free = make_thread(tenant, "free", steps=2)
    hold = legal_hold_place(tenant=tenant, thread=held, reason="matter 7", actor=TESTS)

    with later(days=400):
        assert expire().totals["threads_expired"] == 1
    held.refresh_from_db()
    assert held.deleted_at is None and held.wrapped_data_key is not None
    assert content_rows(held)["checkpoints"] == 2
    stored_cipher(held.pk)  # still readable
    assert Thread.objects.get(pk=free.pk).deleted_at is not None

    legal_hold_lift(hold=hold, actor=TESTS)
    with later(days=400):
        assert expire().totals["threads_expired"] == 1
    assert Thread.objects.get(pk=held.pk).deleted_at is not None
    kinds = set(AuditEvent.objects.for_tenant(tenant).values_list("kind", flat=True))
    assert {"legal_hold.placed", "legal_hold.lifted"} <= kinds


def test_a_tenant_wide_hold_keeps_every_thread_of_the_tenant():
    tenant, other = make_tenant(), make_tenant()
    mine = make_thread(tenant, steps=1)
    theirs = make_thread(other, steps=1)
    legal_hold_place(tenant=tenant, reason="litigation", actor=TESTS)
    with later(days=400):
        expire()
    assert Thread.objects.get(pk=mine.pk).deleted_at is None
    assert Thread.objects.get(pk=theirs.pk).deleted_at is not None


def test_recent_activity_and_active_runs_keep_a_thread_alive():
    """Checkpoints are written in real time here: LangGraph's checkpoint ids
    come from a clock that must not be sent into the future (later ids of
    this process would sort after other processes' newer ones)."""
    tenant = make_tenant()
    retention_policy_set(tenant=tenant, actor=TESTS, checkpoint_ttl_days=30)
    touched = make_thread(tenant, "touched", steps=1)
    running = make_thread(tenant, "running", steps=1)
    Run.objects.filter(thread=running).update(status=Run.Status.RUNNING)
    now = timezone.now()
    # Both rows quiet for 40 days; a checkpoint of "touched" is 10 days old.
    Thread.objects.filter(pk__in=[touched.pk, running.pk]).update(
        updated_at=now - timedelta(days=40)
    )
    Checkpoint.objects.filter(thread=running).update(
        created_at=now - timedelta(days=40)
    )
    Checkpoint.objects.filter(thread=touched).update(
        created_at=now - timedelta(days=10)
    )
    assert expire().totals["threads_expired"] == 0
    with later(days=21):
        assert expire().totals["threads_expired"] == 1
    assert Thread.objects.get(pk=touched.pk).deleted_at is not None
    assert Thread.objects.get(pk=running.pk).deleted_at is None


def test_an_explicit_expiry_date_wins_over_the_ttl():
    tenant = make_tenant()
    thread = make_thread(tenant, steps=1)
    Thread.objects.filter(pk=thread.pk).update(
        expires_at=timezone.now() + timedelta(days=1)
    )
    with later(days=2):
        assert expire().totals["threads_expired"] == 1


def test_a_dry_run_lists_the_threads_and_changes_nothing():
    tenant = make_tenant()
    thread = make_thread(tenant, "case-9", steps=3)
    with later(days=400):
        report = job_run("expire_threads", dry_run=True)
    assert report.totals["threads_expired"] == 1 and report.totals["checkpoints"] == 3
    assert any("case-9" in line for line in report.plan)
    thread.refresh_from_db()
    assert thread.deleted_at is None and content_rows(thread)["checkpoints"] == 3
    assert not AuditEvent.objects.for_tenant(tenant).filter(
        kind__in=["thread.deleted", "retention.job_ran"]
    )
