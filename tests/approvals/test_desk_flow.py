"""The desk on real refund runs, executed by a real Celery worker: the card's
context from the latest checkpoint, the thread's page, one decision service."""

from __future__ import annotations

import re

import pytest

from approvals.models import ApprovalRequest
from audit.models import AuditEvent
from tests.approvals.helpers import (
    card_url,
    decide_url,
    logged_in,
    open_card,
    start_refund,
    wait_run,
)
from tests.factories import make_member, tenant_with_client

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


def _interrupted_refund(client, thread_id="case-7"):
    run_id = start_refund(client, thread_id=thread_id)
    wait_run(client, thread_id, run_id, "interrupted")
    return ApprovalRequest.objects.select_related("thread").get(
        thread__thread_id=thread_id
    )


def test_card_shows_the_threads_context_and_the_read_is_audited(worker):
    tenant, client = tenant_with_client()
    approval = _interrupted_refund(client)
    reviewer = make_member(tenant, username="rita").user
    response, _ = open_card(logged_in(reviewer), approval)
    context = response.context["card"]["context"]
    html = response.content.decode()

    assert "unavailable" not in context
    assert context["messages"][0]["role"] == "human"
    # The customer's message as text, not the JSON the agent wrapped it in.
    customer = context["messages"][0]["text"].splitlines()
    assert (
        customer[0] == "customer_message: My blender arrived damaged, please refund me."
    )
    assert customer[1] == "order: amount=40.00, currency=EUR, id=A-1001"
    assert any(
        "refund_order" in call for m in context["messages"] for call in m["tool_calls"]
    )
    # The plan says what the card says already (action, arguments, reason):
    # it is not repeated.
    assert context["plan"] is None
    assert "My blender arrived damaged" in html
    # One read of the request's content, the thread's context included.
    read = AuditEvent.objects.for_tenant(tenant).get(kind="approval.read")
    assert read.actor_label == "rita" and read.thread_id == "case-7"
    assert read.data["how"] == "card"
    assert read.data["checkpoint_id"] == context["checkpoint_id"]
    assert not AuditEvent.objects.filter(kind="thread.state_read").exists()


def test_admin_decision_resumes_the_run_like_the_rest_decision(worker):
    tenant, client = tenant_with_client()
    approval = _interrupted_refund(client)
    reviewer = make_member(tenant, username="rita").user
    desk = logged_in(reviewer)
    _, opening = open_card(desk, approval)
    response = desk.post(
        decide_url(approval), {"verdict": "approve", "opening": opening}, follow=True
    )
    run_id = re.search(
        r"The run resumes \(run ([0-9a-f-]+)\)", response.content.decode()
    )[1]
    wait_run(client, "case-7", run_id, "succeeded")
    state = client.get("/api/v1/threads/case-7/state").json()
    assert state["values"]["outcome"] == "refunded"
    assert state["values"]["decision"]["reviewer"] == "rita"
    body = client.get(f"/api/v1/approvals/{approval.pk}").json()
    assert body["status"] == "approved"
    assert body["decisions"][0]["reviewer"] == "rita"


def test_thread_page_shows_the_timeline_and_an_audited_state(worker):
    tenant, client = tenant_with_client()
    approval = _interrupted_refund(client)
    auditor = logged_in(make_member(tenant, role="auditor", username="audrey").user)
    url = f"/admin/runs/thread/{approval.thread_id}/change/"

    page = auditor.get(url)
    html = page.content.decode()
    assert page.status_code == 200
    assert "refund@1" in html and 'id="thread-status">interrupted<' in html
    assert card_url(approval) in html  # pending approval linked
    timeline = page.context["timeline"]
    assert [e["run"].status for e in timeline if e["type"] == "run"] == ["interrupted"]
    checkpoints = [e["checkpoint_id"] for e in timeline if e["type"] == "checkpoint"]
    assert len(checkpoints) >= 3
    assert not AuditEvent.objects.filter(kind="thread.state_read").exists()

    chosen = checkpoints[-2]  # step 0: the input, read into the state
    state_page = auditor.get(f"{url}?checkpoint={chosen}").content.decode()
    assert "My blender arrived damaged" in state_page
    read = AuditEvent.objects.for_tenant(tenant).get(kind="thread.state_read")
    assert read.actor_label == "audrey" and read.data["checkpoint_id"] == chosen

    missing = auditor.get(f"{url}?checkpoint=not-a-checkpoint").content.decode()
    assert "has no checkpoint not-a-checkpoint" in missing
