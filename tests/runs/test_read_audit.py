"""Every response that decrypts thread content leaves one `*.read` audit
event, whatever it lists (issue 16, finding 6): thread detail (interrupt
values), approval detail (payload), runs with their errors; /state already
did."""

import pytest

from approvals.models import ApprovalRequest
from audit.models import AuditEvent
from runs.models import Run
from tests.factories import tenant_with_client
from tests.runs.test_approvals_flow import interrupted_thread

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


def reads(tenant, kind: str) -> list[AuditEvent]:
    return list(AuditEvent.objects.for_tenant(tenant).filter(kind=kind))


def test_thread_and_approval_detail_are_audited_once_per_request(worker):
    tenant, client = tenant_with_client()
    interrupted_thread(client, "gate")
    approval = ApprovalRequest.objects.get()

    for _ in range(2):
        body = client.get("/api/v1/threads/t1").json()
        assert body["interrupts"][0]["value"]["action"]
    events = reads(tenant, "thread.read")
    assert len(events) == 2
    assert events[0].data == {"interrupts": 1} and events[0].thread_id == "t1"
    assert events[0].actor_type == "api_key"

    assert client.get(f"/api/v1/approvals/{approval.pk}").json()["payload"]
    (event,) = reads(tenant, "approval.read")
    assert event.data["approval_id"] == str(approval.pk)
    assert event.action == approval.action
    # Lists that decrypt nothing are not reads of content.
    client.get("/api/v1/approvals")
    assert len(reads(tenant, "approval.read")) == 1


def test_a_page_of_runs_with_errors_is_one_read(worker):
    tenant, client = tenant_with_client()
    failed = interrupted_thread(client, "incomplete")
    assert failed.status == Run.Status.FAILED
    listing = client.get("/api/v1/threads/t1/runs").json()["results"]
    assert listing[0]["error"]
    client.get(f"/api/v1/threads/t1/runs/{failed.pk}")
    events = reads(tenant, "run.read")
    assert [event.data for event in events] == [
        {"runs": 1, "run_ids": [str(failed.pk)]}
    ] * 2
