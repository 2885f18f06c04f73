"""The audit trail of a real refund run holds no trace of the customer's words."""

import json
import uuid

import pytest

from audit.models import AuditEvent
from runs.models import Run
from tests.factories import tenant_with_client
from tests.workers import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


def test_customer_message_marker_leaves_no_trace_in_any_audit_row(worker):
    marker = f"MARKER-{uuid.uuid4().hex}"
    tenant, client = tenant_with_client()
    client.post("/api/v1/threads", {"thread_id": "case-1", "agent": "refund"},
                format="json")
    started = client.post(
        "/api/v1/threads/case-1/runs",
        {"input": {"customer_message": f"Broken on arrival. I am {marker}, call me.",
                   "order": {"id": "A-1001", "amount": "40.00"}}},
        format="json",
    )
    run_id = started.json()["run_id"]
    wait_for(lambda: Run.objects.get(pk=run_id).status == "interrupted",
             what="the refund to wait for approval")
    approval_id = client.get("/api/v1/threads/case-1").json()["pending_approvals"][0]
    decided = client.post(f"/api/v1/approvals/{approval_id}/decision",
                          {"approved": True, "note": f"ok for {marker}"}, format="json")
    resumed = decided.json()["resumed_run"]["run_id"]
    wait_for(lambda: Run.objects.get(pk=resumed).status == "succeeded",
             what="the refund to finish")
    client.get("/api/v1/threads/case-1/state")  # a state read is audited too

    rows = list(AuditEvent.objects.for_tenant(tenant).values())
    kinds = {row["kind"] for row in rows}
    assert {"approval.requested", "approval.decided", "tool_call.succeeded",
            "run.succeeded"} <= kinds
    dumped = json.dumps(rows, default=str)
    assert marker not in dumped
    # The safe arguments the agent declared do appear, in clear.
    assert "A-1001" in dumped and "40.00" in dumped
