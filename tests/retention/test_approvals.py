"""Escalation along the chain and orphaned approvals, without a worker."""

from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone

from approvals.models import ApprovalRequest
from approvals.policy import next_hop, policy_for
from audit.models import AuditEvent
from retention.jobs import job_run
from retention.services import retention_policy_set, thread_deletion_request
from runs.crypto import ThreadCipher
from runs.models import Run, Thread
from tests.factories import make_member, make_tenant
from tests.retention.helpers import TESTS, make_thread

pytestmark = pytest.mark.django_db


def waiting_thread(tenant, **fields):
    thread = make_thread(tenant, steps=1)
    Thread.objects.filter(pk=thread.pk).update(status=Thread.Status.INTERRUPTED)
    approval = ApprovalRequest.objects.get(thread=thread)
    ApprovalRequest.objects.filter(pk=approval.pk).update(
        due_at=timezone.now() + timedelta(hours=1), **fields
    )
    approval.refresh_from_db()
    return thread, approval


def at(approval, hours: float):
    return time_machine.travel(approval.due_at + timedelta(hours=hours), tick=False)


def test_each_hop_waits_its_time_after_the_previous_one(
    django_capture_on_commit_callbacks,
):
    tenant = make_tenant()
    reviewer = make_member(tenant, role="reviewer").user
    officer = make_member(tenant, role="compliance_officer").user
    for user in (reviewer, officer):
        user.email = f"{user.username}@example.com"
        user.save()
    thread, approval = waiting_thread(tenant)

    def sweep():
        with django_capture_on_commit_callbacks(execute=True):
            return job_run("escalate_approvals").totals

    with at(approval, -0.5):
        assert sweep() == {}
    with at(approval, 0.1):
        assert sweep() == {"step_remind": 1}
        assert sweep() == {}
    # Who is told: the step's roles, by mail from a worker after the commit
    # (tests/approvals/test_notifications.py reads those mails).
    (remind,) = AuditEvent.objects.for_tenant(tenant).filter(kind="approval.escalated")
    assert remind.data["notify"] == ["reviewer"] and remind.data["notified"] == 1
    # Late sweep: the escalation still waits 4 hours after the actual reminder.
    # No worker runs here: the reminder's mail, owed past its grace, is the
    # sweep's to send (tests/approvals/test_notice_recovery.py).
    with at(approval, 3.9):
        assert sweep() == {"notices_sent": 1}
    with at(approval, 4.2):
        assert sweep() == {"step_escalate": 1}
    escalate = AuditEvent.objects.for_tenant(tenant).filter(kind="approval.escalated")
    assert escalate.last().data["notify"] == ["compliance_officer"]
    approval.refresh_from_db()
    assert approval.escalation_level == 2
    assert next_hop(approval, policy_for(tenant)).at == approval.escalated_at + (
        timedelta(hours=24)
    )
    with at(approval, 28.0):
        assert sweep() == {"notices_sent": 1}  # the escalation's, to the officer
    with at(approval, 28.3), django_capture_on_commit_callbacks() as dispatched:
        assert job_run("escalate_approvals").totals == {"expired": 1}

    approval.refresh_from_db()
    assert approval.status == "expired"
    resumed = Run.objects.filter(thread=thread, kind="resume").get()
    # The audit trail's own callbacks (announcing the committed events, closing
    # a commit's batch: audit.services) are callbacks too; besides them, one
    # run was dispatched, and the compliance officer's notice of the expiry
    # queued.
    tasks = [
        c
        for c in dispatched
        if getattr(getattr(c, "func", c), "__module__", "") != "audit.services"
    ]
    assert resumed.status == "queued" and len(tasks) == 2
    value = ThreadCipher.for_thread(thread).decrypt_value(
        resumed.resume, row=("run-resume", str(resumed.id))
    )
    assert value[approval.interrupt_id]["approved"] is False
    assert "expired" in value[approval.interrupt_id]["note"]
    hops = AuditEvent.objects.for_tenant(tenant).filter(
        kind__in=["approval.escalated", "approval.expired"]
    )
    assert [(e.kind, e.data.get("step")) for e in hops] == [
        ("approval.escalated", "remind"),
        ("approval.escalated", "escalate"),
        ("approval.expired", None),
    ]


def test_a_tenant_chain_with_one_hop_expires_after_it():
    tenant = make_tenant()
    retention_policy_set(
        tenant=tenant,
        actor=TESTS,
        escalation_chain=[{"name": "page", "after_hours": 1, "notify": ["reviewer"]}],
        expire_after_hours=2,
    )
    _, approval = waiting_thread(tenant)
    with at(approval, 1.1):
        assert job_run("escalate_approvals").totals == {"step_page": 1}
    with at(approval, 3.2):
        assert job_run("escalate_approvals").totals == {"expired": 1}


@pytest.mark.parametrize(
    "breakage, reason",
    [
        ("run_cancelled", "run cancelled"),
        ("run_failed", "run failed"),
        ("version_gone", "agent version echo@9 gone"),
        ("thread_deleted", "thread deleted"),
    ],
)
def test_orphaned_approvals_are_closed_with_the_reason(breakage, reason):
    tenant = make_tenant()
    thread, approval = waiting_thread(tenant)
    healthy_thread, healthy = waiting_thread(tenant)
    if breakage == "run_cancelled":
        Run.objects.filter(pk=approval.run_id).update(status=Run.Status.CANCELLED)
    elif breakage == "run_failed":
        Run.objects.filter(pk=approval.run_id).update(status=Run.Status.FAILED)
    elif breakage == "version_gone":
        Run.objects.filter(pk=approval.run_id).update(agent_version="9")
    else:
        Thread.objects.filter(pk=thread.pk).update(deleted_at=timezone.now())

    assert job_run("close_orphaned_approvals", dry_run=True).totals == {"closed": 1}
    report = job_run("close_orphaned_approvals")
    assert report.totals == {"closed": 1}
    approval.refresh_from_db()
    healthy.refresh_from_db()
    assert approval.status == "cancelled" and healthy.status == "pending"
    event = AuditEvent.objects.for_tenant(tenant).get(kind="approval.closed")
    assert event.data["reason"] == reason
    assert event.data["approval_id"] == str(approval.pk)


def test_deleting_a_thread_closes_its_open_approvals():
    tenant = make_tenant()
    thread, approval = waiting_thread(tenant)
    thread_deletion_request(thread=thread, actor=TESTS)
    approval.refresh_from_db()
    assert approval.status == "cancelled"
    assert (
        AuditEvent.objects.for_tenant(tenant).get(kind="approval.closed").data["reason"]
        == "thread deleted on request"
    )
