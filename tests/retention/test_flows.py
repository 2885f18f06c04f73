"""Retention against real refund runs executed by a real Celery worker."""

from datetime import timedelta

import pytest
import time_machine

from approvals.models import ApprovalRequest
from audit.models import AuditEvent
from demo.models import DemoOutboxMessage, DemoPayment
from retention.jobs import job_run
from retention.services import retention_policy_set
from runs.models import Checkpoint, PendingWrite, Run
from tests.factories import tenant_with_client
from tests.retention.helpers import TESTS
from tests.runs.test_refund_flow import pending_approval, start_refund, wait_run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


def test_pruning_keeps_the_latest_n_and_the_interrupted_thread_resumes(worker):
    tenant, client = tenant_with_client()
    run_id = start_refund(client)
    wait_run(client, "case-1", run_id, "interrupted")
    checkpoints = Checkpoint.objects.filter(thread__thread_id="case-1")
    before = list(
        checkpoints.order_by("-checkpoint_id").values_list("checkpoint_id", flat=True)
    )
    assert len(before) > 2
    interrupts_before = client.get("/api/v1/threads/case-1").json()["interrupts"]
    retention_policy_set(tenant=tenant, actor=TESTS, keep_latest_checkpoints=2)

    report = job_run("prune_checkpoints")

    assert report.totals["threads_pruned"] == 1
    assert report.totals["checkpoints"] == len(before) - 2
    assert (
        list(
            checkpoints.order_by("-checkpoint_id").values_list(
                "checkpoint_id", flat=True
            )
        )
        == before[:2]
    )
    assert PendingWrite.objects.filter(
        thread__thread_id="case-1", checkpoint_id=before[0], channel="__interrupt__"
    ).exists()
    assert client.get("/api/v1/threads/case-1").json()["interrupts"] == (
        interrupts_before
    )
    history = client.get("/api/v1/threads/case-1/history").json()
    assert [entry["checkpoint_id"] for entry in history["results"]] == before[:2]

    approval = pending_approval(client, "case-1")
    decided = client.post(
        f"/api/v1/approvals/{approval['id']}/decision",
        {"approved": True, "reviewer": "rita"},
        format="json",
    )
    assert decided.status_code == 200, decided.content
    wait_run(client, "case-1", decided.json()["resumed_run"]["run_id"], "succeeded")
    state = client.get("/api/v1/threads/case-1/state").json()
    assert state["values"]["outcome"] == "refunded"
    assert state["values"]["decision"]["approved"] is True
    assert DemoPayment.objects.for_tenant(tenant).count() == 1


def test_an_unanswered_approval_is_reminded_escalated_expired_and_the_run_ends(
    worker,
):
    tenant, client = tenant_with_client()
    run_id = start_refund(client)
    wait_run(client, "case-1", run_id, "interrupted")
    approval = ApprovalRequest.objects.get(thread__thread_id="case-1")
    waited = approval.due_at - approval.created_at
    assert abs(waited - timedelta(hours=24)) < timedelta(seconds=1)  # low risk

    for hours, expected in ((0.1, "step_remind"), (4.2, "step_escalate")):
        with time_machine.travel(approval.due_at + timedelta(hours=hours)):
            assert job_run("escalate_approvals").totals == {expected: 1}
    with time_machine.travel(approval.due_at + timedelta(hours=27)):
        assert job_run("escalate_approvals").totals == {}
    with time_machine.travel(approval.due_at + timedelta(hours=28.3)):
        assert job_run("escalate_approvals").totals == {"expired": 1}

    resumed = Run.objects.get(thread__thread_id="case-1", kind="resume")
    wait_run(client, "case-1", str(resumed.id), "succeeded")
    shown = client.get(f"/api/v1/approvals/{approval.id}").json()
    assert shown["status"] == "expired" and shown["escalation_level"] == 2
    state = client.get("/api/v1/threads/case-1/state").json()["values"]
    assert state["outcome"] == "denied"
    assert state["decision"]["approved"] is False
    assert state["decision"]["reviewer"] == "system (expired)"
    assert not DemoPayment.objects.for_tenant(tenant).exists()
    assert DemoOutboxMessage.objects.for_tenant(tenant).get().kind == "refund_declined"
    trail = list(
        AuditEvent.objects.for_tenant(tenant)
        .filter(thread_id="case-1")
        .order_by("seq")
        .values_list("kind", "data")
    )
    hops = [(kind, data.get("step")) for kind, data in trail if "escalat" in kind]
    assert hops == [
        ("approval.escalated", "remind"),
        ("approval.escalated", "escalate"),
    ]
    kinds = [kind for kind, _ in trail]
    expired_at = kinds.index("approval.expired")
    assert kinds[expired_at - 1] == "run.queued"  # the resume, with the denial
    assert "run.succeeded" in kinds[expired_at:]
    jobs = AuditEvent.objects.for_tenant(tenant).filter(kind="retention.job_ran")
    assert jobs.count() == 3
