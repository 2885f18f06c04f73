"""A request after its decision: who decided, when, after how long, what
became of the run; and the card's reading comforts (a first approver waits,
errors on top, times in the reader's zone, links to the thread and its
audit timeline)."""

from __future__ import annotations

import datetime
import uuid
from types import SimpleNamespace

import pytest
from django.db import transaction
from django.utils import timezone

from approvals.cards import context_of
from approvals.models import ApprovalRequest
from approvals.services import (
    Reviewer,
    approval_close,
    approval_decide,
    approval_expire,
)
from audit.models import AuditEvent
from runs.crypto import ThreadCipher
from runs.models import Run, ToolCall
from tests.approvals.helpers import (
    card_url,
    decide_url,
    logged_in,
    open_card,
    waiting_request,
)
from tests.factories import make_member, make_tenant

pytestmark = pytest.mark.django_db


@pytest.fixture
def tenant():
    return make_tenant()


@pytest.fixture
def rita(tenant):
    return make_member(tenant, role="reviewer", username="rita").user


def decided(approval, user, approved=True, note="fine"):
    approved_request, run = approval_decide(
        approval=approval,
        reviewer=Reviewer.for_user(user),
        approved=approved,
        note=note,
    )
    return approved_request, run


def finish(run: Run, status: str, *, error: str = "") -> None:
    """What a worker would have written when the resumed run ended."""
    run.status = status
    run.ended_at = timezone.now()
    if error:
        cipher = ThreadCipher.for_thread(run.thread)
        run.error = cipher.encrypt_value(error, row=("run-error", str(run.id)))
        run.error_type = "RuntimeError"
    run.save()


def page(client, approval) -> str:
    response = client.get(card_url(approval))
    assert response.status_code == 200
    return response.content.decode()


def test_a_decided_card_says_who_when_after_how_long_and_drops_pending_fields(
    tenant, rita
):
    approval = waiting_request(tenant, thread_id="case-decided")
    ApprovalRequest.objects.filter(pk=approval.pk).update(
        created_at=timezone.now() - datetime.timedelta(hours=2, minutes=3)
    )
    approval.refresh_from_db()
    decided(approval, rita)
    approval.refresh_from_db()

    html = page(logged_in(rita), approval)

    assert '<strong id="desk-decider">rita</strong>' in html
    assert approval.decided_at.strftime("%Y-%m-%d %H:%M:%S UTC") in html
    assert '<dd id="desk-decided-after">2 h 3 min waiting</dd>' in html
    assert "It is still running." in html  # queued: no worker in this test
    assert "Waiting for</dt>" not in html and "Escalates</dt>" not in html
    assert 'id="desk-approve"' not in html


def test_a_run_that_succeeded_shows_what_it_did(tenant, rita):
    approval = waiting_request(tenant)
    _, run = decided(approval, rita)
    key = uuid.uuid4().hex
    cipher = ThreadCipher.for_thread(approval.thread)
    ToolCall.objects.create(
        tenant=tenant,
        thread=approval.thread,
        idempotency_key=key,
        tool="payments.refund",
        args_digest="x",
        status=ToolCall.Status.SUCCEEDED,
        result=cipher.encrypt_value(
            {"payment_id": "pay_77", "amount": "40.00"}, row=("tool-result", key)
        ),
    )
    finish(run, "succeeded")

    html = page(logged_in(rita), approval)

    assert "It resumed and succeeded." in html
    assert "payments.refund</code> succeeded: payment_id=pay_77, amount=40.00" in html
    read = AuditEvent.objects.for_tenant(tenant).get(kind="run.output_read")
    assert read.actor_label == "rita" and read.run_id == str(run.pk)


def test_a_run_that_failed_shows_its_error_text_and_the_read_is_audited(tenant, rita):
    approval = waiting_request(tenant)
    _, run = decided(approval, rita)
    finish(run, "failed", error="the payment provider answered 503")

    html = page(logged_in(rita), approval)

    assert '<span id="desk-run-error">the payment provider answered 503</span>' in html
    read = AuditEvent.objects.for_tenant(tenant).get(kind="run.read")
    assert read.actor_label == "rita" and read.data["run_ids"] == [str(run.pk)]


def test_a_denied_card_names_the_denier(tenant, rita):
    approval = waiting_request(tenant)
    decided(approval, rita, approved=False, note="not damaged")
    html = page(logged_in(make_member(tenant, role="auditor").user), approval)
    assert "Denied by <strong" in html


def test_a_first_approver_waits_for_a_second_reviewer(tenant, rita):
    approval = waiting_request(tenant, amount="900.00")
    decided(approval, rita)

    html = page(logged_in(rita), approval)
    assert "waiting for a second reviewer" in html
    assert 'id="desk-approve"' not in html
    assert "deciding it needs the reviewer" not in html  # they are a reviewer

    sam = make_member(tenant, role="reviewer", username="sam").user
    assert 'id="desk-approve"' in page(logged_in(sam), approval)


def test_form_errors_are_at_the_top_of_the_page(tenant, rita):
    approval = waiting_request(tenant)
    client = logged_in(rita)
    _, opening = open_card(client, approval)
    response = client.post(
        decide_url(approval), {"verdict": "deny", "opening": opening}
    )
    html = response.content.decode()
    assert response.status_code == 400
    top = html.index('id="desk-form-errors"')
    assert top < html.index('id="desk-card"')
    assert "A denial needs a note" in html[top : html.index('id="desk-card"')]


def test_times_are_in_the_readers_zone_with_seconds(tenant, rita):
    approval = waiting_request(tenant)
    client = logged_in(rita)
    client.cookies["gatehouse_tz"] = "Asia/Tokyo"
    local = timezone.localtime(
        approval.created_at, datetime.timezone(datetime.timedelta(hours=9))
    )
    assert local.strftime("%Y-%m-%d %H:%M:%S JST") in page(client, approval)

    client.cookies["gatehouse_tz"] = "../../etc/passwd"  # not a zone: UTC
    html = page(client, approval)
    assert approval.created_at.strftime("%Y-%m-%d %H:%M:%S UTC") in html


def test_the_card_links_its_thread_run_and_for_auditors_the_timeline(tenant, rita):
    approval = waiting_request(tenant, thread_id="case-links")
    html = page(logged_in(rita), approval)
    assert f'href="/admin/runs/thread/{approval.thread_id}/change/"' in html
    assert f'href="/admin/runs/run/{approval.run_id}/change/"' in html
    assert "/admin/audit/auditevent/timeline/" not in html  # reviewers read no audit

    officer = make_member(tenant, role="compliance_officer").user
    timeline = f"/admin/audit/auditevent/timeline/{tenant.pk}/case-links/"
    assert f'href="{timeline}"' in page(logged_in(officer), approval)


def test_context_reads_as_text_and_says_nothing_twice():
    snapshot = SimpleNamespace(
        values={
            "messages": [
                {
                    "type": "human",
                    "content": '{"customer_message": "Broken.", '
                    '"order": {"id": "A-1", "amount": "4.00"}}',
                }
            ],
            "plan": {"action": "refund_order", "args": {"id": "A-1"}, "steps": 2},
        },
        metadata={"step": 3},
        config={"configurable": {"checkpoint_id": "c1"}},
        created_at="2026-11-30T10:00:00+00:00",
    )
    context = context_of(snapshot, shown=["refund_order", {"id": "A-1"}])
    assert context["messages"][0]["text"] == (
        "customer_message: Broken.\norder: id=A-1, amount=4.00"
    )
    assert context["plan"] == "steps: 2"
    assert context["created_at"] == "2026-11-30 10:00:00 UTC"


def test_the_api_keeps_utc_whatever_zone_the_browser_names(tenant, rita):
    approval = waiting_request(tenant)
    client = logged_in(rita)
    client.cookies["gatehouse_tz"] = "Asia/Tokyo"
    body = client.get(f"/api/v1/approvals/{approval.pk}").json()
    assert body["created_at"].endswith("Z")


def test_an_expired_card_says_nobody_decided_and_a_closed_one_resumed_nothing(
    tenant, rita
):
    expired = waiting_request(tenant)
    with transaction.atomic():
        approval_expire(
            approval=ApprovalRequest.objects.select_for_update().get(pk=expired.pk)
        )
    html = page(logged_in(rita), expired)
    assert "Expired: nobody decided in time, and it was denied" in html
    assert "Waiting for</dt>" not in html

    closed = waiting_request(tenant)
    with transaction.atomic():
        approval_close(
            approval=ApprovalRequest.objects.select_for_update().get(pk=closed.pk),
            reason="the thread was closed",
        )
    html = page(logged_in(rita), closed)
    assert "Closed: no run was resumed." in html
