"""The refund agent end to end over HTTP, executed by a real Celery worker."""

import pytest

from audit.models import AuditEvent
from demo.models import DemoOutboxMessage, DemoPayment
from runs.models import Run, ToolCall
from tests.factories import (
    REFUND_INPUT,
    api_client,
    make_api_key,
    make_member,
    tenant_with_client,
)
from tests.workers import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


def start_refund(client, thread_id="case-1", refund_input=REFUND_INPUT):
    created = client.post(
        "/api/v1/threads", {"thread_id": thread_id, "agent": "refund"}, format="json"
    )
    assert created.status_code == 201, created.content
    started = client.post(
        f"/api/v1/threads/{thread_id}/runs", {"input": refund_input}, format="json"
    )
    assert started.status_code == 202, started.content
    assert started.json()["status"] == "queued"
    return started.json()["run_id"]


def run_status(client, thread_id, run_id):
    return client.get(f"/api/v1/threads/{thread_id}/runs/{run_id}").json()["status"]


def wait_run(client, thread_id, run_id, status, timeout=30):
    wait_for(
        lambda: run_status(client, thread_id, run_id) == status,
        timeout=timeout,
        what=f"run {run_id} to be {status}",
    )


def pending_approval(client, thread_id):
    thread = client.get(f"/api/v1/threads/{thread_id}").json()
    assert thread["status"] == "interrupted"
    (approval_id,) = thread["pending_approvals"]
    return client.get(f"/api/v1/approvals/{approval_id}").json()


def test_refund_approved_end_to_end(worker):
    tenant, client = tenant_with_client()
    run_id = start_refund(client)
    wait_run(client, "case-1", run_id, "interrupted")

    thread = client.get("/api/v1/threads/case-1").json()
    assert thread["agent_version"] == "1"
    assert len(thread["interrupts"]) == 1
    approval = pending_approval(client, "case-1")
    assert approval["payload"]["action"] == "refund_order"
    assert approval["payload"]["args"] == {
        "order_id": "A-1001",
        "amount": "40.00",
        "currency": "EUR",
    }
    assert "damaged" in approval["payload"]["reason"]
    assert "40.00 EUR" in approval["payload"]["affects"]
    assert approval["payload"]["if_denied"]
    assert approval["risk"] == "low" and approval["gate"] == "action"
    assert approval["interrupt_id"] == thread["interrupts"][0]["id"]

    decided = client.post(
        f"/api/v1/approvals/{approval['id']}/decision",
        {"approved": True, "reviewer": "rita"},
        format="json",
    )
    assert decided.status_code == 200, decided.content
    assert decided.json()["status"] == "approved"
    resumed = decided.json()["resumed_run"]["run_id"]
    wait_run(client, "case-1", resumed, "succeeded")

    assert DemoPayment.objects.for_tenant(tenant).filter(order_id="A-1001").count() == 1
    assert DemoOutboxMessage.objects.for_tenant(tenant).get().kind == "refund_issued"
    state = client.get("/api/v1/threads/case-1/state").json()
    assert state["values"]["outcome"] == "refunded"
    # A service key decided: the name it sent is its unverified label.
    assert state["values"]["decision"]["reviewer"].endswith("(unverified label “rita”)")
    assert client.get("/api/v1/threads/case-1").json()["status"] == "idle"
    kinds = list(AuditEvent.objects.for_tenant(tenant).values_list("kind", flat=True))
    for kind in [
        "thread.created",
        "run.queued",
        "run.started",
        "run.interrupted",
        "approval.requested",
        "approval.decided",
        "tool_call.started",
        "tool_call.succeeded",
        "run.succeeded",
        "thread.state_read",
    ]:
        assert kind in kinds, kind


def test_refund_denied_tells_the_customer(worker):
    tenant, client = tenant_with_client()
    run_id = start_refund(client)
    wait_run(client, "case-1", run_id, "interrupted")
    approval = pending_approval(client, "case-1")
    decided = client.post(
        f"/api/v1/approvals/{approval['id']}/decision",
        {"approved": False, "note": "Outside the refund window."},
        format="json",
    )
    assert decided.status_code == 200, decided.content
    wait_run(client, "case-1", decided.json()["resumed_run"]["run_id"], "succeeded")
    assert not DemoPayment.objects.for_tenant(tenant).exists()
    assert DemoOutboxMessage.objects.for_tenant(tenant).get().kind == "refund_declined"
    assert (
        client.get("/api/v1/threads/case-1/state").json()["values"]["outcome"]
        == "denied"
    )


def test_edited_args_are_executed_and_recorded_beside_the_original(worker):
    tenant, client = tenant_with_client()
    run_id = start_refund(client)
    wait_run(client, "case-1", run_id, "interrupted")
    approval = pending_approval(client, "case-1")
    edited = {"order_id": "A-1001", "amount": "25.00", "currency": "EUR"}
    decided = client.post(
        f"/api/v1/approvals/{approval['id']}/decision",
        {"approved": True, "args": edited, "note": "One item is kept."},
        format="json",
    )
    body = decided.json()
    assert body["payload"]["args"]["amount"] == "40.00"
    assert body["decisions"][0]["args"] == edited
    assert body["edits"] == [{"arg": "amount", "old": "40.00", "new": "25.00"}]
    wait_run(client, "case-1", body["resumed_run"]["run_id"], "succeeded")
    assert DemoPayment.objects.for_tenant(tenant).get().amount == 25


def test_high_risk_needs_two_people_not_two_labels(worker):
    """The issue's attack: one key deciding twice under two names."""
    tenant, client = tenant_with_client()
    big = {**REFUND_INPUT, "order": {"id": "A-2002", "amount": "900.00"}}
    run_id = start_refund(client, refund_input=big)
    wait_run(client, "case-1", run_id, "interrupted")
    approval = pending_approval(client, "case-1")
    assert approval["risk"] == "high" and approval["required_approvals"] == 2
    url = f"/api/v1/approvals/{approval['id']}/decision"
    first = client.post(url, {"approved": True, "reviewer": "alice"}, format="json")
    assert first.status_code == 200 and first.json()["status"] == "pending"
    assert first.json()["resumed_run"] is None
    again = client.post(url, {"approved": True, "reviewer": "alice2"}, format="json")
    assert again.status_code == 409 and again.json()["code"] == "same_reviewer"
    assert not DemoPayment.objects.for_tenant(tenant).exists()
    reviewer = make_member(tenant, role="reviewer").user
    _, secret = make_api_key(tenant, ["approvals"], user=reviewer)
    second = api_client(secret).post(url, {"approved": True}, format="json")
    assert second.status_code == 200 and second.json()["status"] == "approved"
    wait_run(client, "case-1", second.json()["resumed_run"]["run_id"], "succeeded")
    assert DemoPayment.objects.for_tenant(tenant).count() == 1


def test_resume_of_a_thread_that_is_not_interrupted_is_409(worker):
    _, client = tenant_with_client()
    run_id = start_refund(client)
    wait_run(client, "case-1", run_id, "interrupted")
    approval = pending_approval(client, "case-1")
    decided = client.post(
        f"/api/v1/approvals/{approval['id']}/decision",
        {"approved": True},
        format="json",
    )
    wait_run(client, "case-1", decided.json()["resumed_run"]["run_id"], "succeeded")
    response = client.post(
        "/api/v1/threads/case-1/resume", {"resume": {"approved": True}}, format="json"
    )
    assert response.status_code == 409
    assert response.json()["code"] == "thread_not_interrupted"


def test_second_start_while_a_run_is_active_is_409(worker):
    _, client = tenant_with_client()
    start_refund(client)
    response = client.post(
        "/api/v1/threads/case-1/runs", {"input": REFUND_INPUT}, format="json"
    )
    assert response.status_code == 409
    assert response.json()["code"] in {"run_in_progress", "thread_interrupted"}


def test_agent_error_fails_the_run_and_keeps_the_thread_readable(worker):
    _, client = tenant_with_client()
    run_id = start_refund(client, refund_input={"customer_message": "hi", "order": {}})
    wait_run(client, "case-1", run_id, "failed")
    run = client.get(f"/api/v1/threads/case-1/runs/{run_id}").json()
    assert run["error"].startswith("ValueError: refund input needs")
    assert client.get("/api/v1/threads/case-1").json()["status"] == "error"
    assert client.get("/api/v1/threads/case-1/history").status_code == 200


def test_worker_killed_inside_the_refund_step_pays_exactly_once(worker):
    """SIGKILL after the provider recorded the payment but before the ledger
    did: the run is taken over and the retry is deduplicated downstream."""
    from runs.dispatch import runs_recover_stalled
    from tests.workers import Worker

    tenant, client = tenant_with_client()
    run_id = start_refund(client)
    wait_run(client, "case-1", run_id, "interrupted")
    approval = pending_approval(client, "case-1")

    worker.stop()  # only the slow worker below may take the resume run
    slow = Worker(
        pool="solo",
        concurrency=1,
        name="slow",
        env={"GATEHOUSE_DEMO_PAYMENT_LATENCY": "30"},
    )
    try:
        decided = client.post(
            f"/api/v1/approvals/{approval['id']}/decision",
            {"approved": True},
            format="json",
        )
        resumed = decided.json()["resumed_run"]["run_id"]
        wait_for(
            lambda: DemoPayment.objects.filter(order_id="A-1001").exists(),
            what="the provider to record the payment",
        )
        assert ToolCall.objects.get(tool="payments.refund").status == "started"
        slow.kill()
    finally:
        slow.stop()
    assert Run.objects.get(pk=resumed).status == "running"

    fresh = Worker(name="fresh")
    try:
        wait_for(
            lambda: runs_recover_stalled()["expired_leases"],
            timeout=20,
            what="the killed worker's lease to expire",
        )
        wait_run(client, "case-1", resumed, "succeeded")
    finally:
        fresh.stop()
        worker.__init__(name="main")  # the session's worker, for later tests

    assert DemoPayment.objects.filter(order_id="A-1001").count() == 1
    call = ToolCall.objects.get(tool="payments.refund")
    assert call.status == "succeeded" and call.attempts == 2
    assert AuditEvent.objects.for_tenant(tenant).filter(kind="run.recovered").exists()
    assert Run.objects.get(pk=resumed).attempts == 2
