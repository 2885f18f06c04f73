"""No dead ends: a run that fails after a decision is run again or closed by
a compliance officer in the admin (audited), and a request whose interrupt is
gone is closed with the reason."""

import pytest
from django.utils import timezone

from approvals.models import ApprovalRequest
from approvals.sweeps import approvals_close_orphaned
from audit.models import AuditEvent
from audit.redaction import digest
from audit.services import Actor
from runs.models import Run, Thread
from runs.services import thread_close
from runs.sweeps import Sweep
from tests.agents import provider_marker
from tests.approvals.helpers import logged_in, wait_run, waiting_request
from tests.factories import make_member, make_tenant, tenant_with_client


def failed_after_approval(api):
    """A flaky thread approved by a reviewer whose resume run then failed."""
    api.post("/api/v1/threads", {"thread_id": "t1", "agent": "flaky"}, format="json")
    run_id = api.post("/api/v1/threads/t1/runs", {"input": {}}, format="json").json()[
        "run_id"
    ]
    wait_run(api, "t1", run_id, "interrupted")
    approval = ApprovalRequest.objects.get()
    decided = api.post(
        f"/api/v1/approvals/{approval.pk}/decision", {"approved": True}, format="json"
    ).json()
    wait_run(api, "t1", decided["resumed_run"]["run_id"], "failed")
    return Thread.objects.get(thread_id="t1")


def thread_page(thread) -> str:
    return f"/admin/runs/thread/{thread.pk}/change/"


@pytest.mark.django_db(transaction=True)
@pytest.mark.worker
def test_a_compliance_officer_retries_a_run_that_failed_after_a_decision(worker):
    tenant, api = tenant_with_client()
    thread = failed_after_approval(api)
    officer = make_member(tenant, role="compliance_officer").user
    client = logged_in(officer)
    page = client.get(thread_page(thread)).content.decode()
    assert 'id="thread-retry"' in page
    marker = provider_marker(thread.pk)
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()  # the provider is back
    try:
        response = client.post(f"/admin/runs/thread/{thread.pk}/retry/")
        assert response.status_code == 302
        retry = Run.objects.get(kind="retry")
        wait_run(api, "t1", str(retry.pk), "succeeded")
    finally:
        marker.unlink()
    state = api.get("/api/v1/threads/t1/state").json()["values"]
    assert state["answers"][-1] == {"acted": True}
    assert state["answers"][0]["one"]["approved"] is True  # the decision it had
    queued = AuditEvent.objects.for_tenant(tenant).get(
        kind="run.queued", run_id=str(retry.pk)
    )
    assert queued.actor_label == officer.username and queued.data["kind"] == "retry"
    assert Run.objects.filter(kind="resume").count() == 1  # no second decision


@pytest.mark.django_db(transaction=True)
@pytest.mark.worker
def test_a_compliance_officer_closes_a_failed_thread_with_a_note(worker):
    tenant, api = tenant_with_client()
    thread = failed_after_approval(api)
    officer = make_member(tenant, role="compliance_officer").user
    client = logged_in(officer)
    url = f"/admin/runs/thread/{thread.pk}/close/"
    client.post(url, {"note": ""})
    assert Thread.objects.get(pk=thread.pk).status == "error"  # a note is needed
    client.post(url, {"note": "Refunded by hand in the provider's console."})
    assert Thread.objects.get(pk=thread.pk).status == "idle"
    event = AuditEvent.objects.for_tenant(tenant).get(kind="thread.closed")
    assert event.actor_label == officer.username
    assert event.data["note"] == digest("Refunded by hand in the provider's console.")


@pytest.mark.django_db
@pytest.mark.parametrize("role", ["reviewer", "tenant_admin", "auditor"])
def test_only_a_compliance_officer_may_retry_or_close(role):
    tenant = make_tenant()
    approval = waiting_request(tenant)
    Run.objects.filter(pk=approval.run_id).update(status="failed")
    Thread.objects.filter(pk=approval.thread_id).update(status="error")
    client = logged_in(make_member(tenant, role=role).user)
    base = f"/admin/runs/thread/{approval.thread_id}"
    assert client.post(f"{base}/retry/").status_code == 403
    assert client.post(f"{base}/close/", {"note": "x"}).status_code == 403
    assert not Run.objects.filter(kind="retry").exists()
    assert Thread.objects.get(pk=approval.thread_id).status == "error"


@pytest.mark.django_db
def test_retry_of_a_thread_whose_last_run_did_not_fail_is_refused():
    tenant = make_tenant()
    approval = waiting_request(tenant)
    client = logged_in(make_member(tenant, role="compliance_officer").user)
    response = client.post(
        f"/admin/runs/thread/{approval.thread_id}/retry/", follow=True
    )
    assert "has no failed run to retry or close" in response.content.decode()
    assert not Run.objects.filter(kind="retry").exists()


@pytest.mark.django_db
def test_closing_a_failed_thread_closes_its_open_requests_with_the_reason():
    tenant = make_tenant()
    approval = waiting_request(tenant)
    Run.objects.filter(pk=approval.run_id).update(status="failed")
    Thread.objects.filter(pk=approval.thread_id).update(status="error")
    officer = make_member(tenant, role="compliance_officer").user
    thread_close(
        thread=approval.thread, actor=Actor.user(officer), note="Handled by phone."
    )
    approval.refresh_from_db()
    assert approval.status == "cancelled"
    closed = AuditEvent.objects.for_tenant(tenant).get(kind="approval.closed")
    assert closed.summary == (
        f"refund_order request closed: thread closed after a failed run by "
        f"{officer.username}"
    )


@pytest.mark.django_db
def test_a_request_whose_interrupt_is_gone_is_closed_with_the_reason():
    tenant = make_tenant()
    approval = waiting_request(tenant)
    Thread.objects.filter(pk=approval.thread_id).update(status="idle")
    result = approvals_close_orphaned(Sweep(now=timezone.now(), batch_size=50))
    assert result.counts[tenant.pk]["closed"] == 1
    approval.refresh_from_db()
    assert approval.status == "cancelled"
    event = AuditEvent.objects.for_tenant(tenant).get(kind="approval.closed")
    assert event.data["reason"] == "the thread no longer waits on this interrupt"


@pytest.mark.django_db
def test_a_retry_that_stops_at_a_closed_requests_interrupt_reopens_it():
    from langgraph.types import Interrupt

    from approvals.content import payload_of
    from approvals.services import approval_close, approval_requests_open

    tenant = make_tenant()
    approval = waiting_request(tenant)
    approval_close(approval=approval, reason="run failed")
    (reopened,) = approval_requests_open(
        run=approval.run,
        interrupts=[Interrupt(value=payload_of(approval), id=approval.interrupt_id)],
    )
    assert reopened.pk == approval.pk and reopened.status == "pending"
    assert payload_of(reopened) == payload_of(approval)
    assert (
        AuditEvent.objects.for_tenant(tenant).filter(kind="approval.requested").count()
        == 2
    )


@pytest.mark.django_db
def test_a_run_that_stops_at_a_pending_requests_interrupt_opens_no_second_one():
    from langgraph.types import Interrupt

    from approvals.content import payload_of
    from approvals.services import approval_requests_open

    tenant = make_tenant()
    approval = waiting_request(tenant)
    reopened = approval_requests_open(
        run=approval.run,
        interrupts=[Interrupt(value=payload_of(approval), id=approval.interrupt_id)],
    )
    assert reopened == []
    assert list(ApprovalRequest.objects.values_list("pk", "status")) == [
        (approval.pk, "pending")
    ]
    assert (
        AuditEvent.objects.for_tenant(tenant).filter(kind="approval.requested").count()
        == 1
    )
