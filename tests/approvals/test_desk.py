"""The reviewer's desk in the admin: the queue and the request page."""

from __future__ import annotations

import datetime
import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals.cards import card_hash, snapshot_card
from approvals.content import decision_detail, payload_of
from approvals.desk_models import DecisionSnapshot, RequestOpening
from approvals.models import ApprovalRequest, Decision
from audit.models import AuditEvent
from runs import storage
from runs.crypto import ThreadCipher
from runs.models import Run
from tests.approvals.helpers import (
    card_url,
    decide_url,
    logged_in,
    open_card,
    waiting_request,
)
from tests.factories import make_member, make_tenant

pytestmark = pytest.mark.django_db

QUEUE = "/admin/approvals/approvalrequest/"


@pytest.fixture
def tenant():
    return make_tenant()


@pytest.fixture
def reviewer(tenant):
    return make_member(tenant, role="reviewer").user


def _thread_ids_in_order(html: str) -> list[str]:
    return re.findall(r'/admin/runs/thread/\d+/change/">([^<]+)<', html)


def test_queue_lists_pending_first_by_due_time(tenant, reviewer):
    late = waiting_request(tenant, thread_id="due-late")
    soon = waiting_request(tenant, thread_id="due-soon")
    decided = waiting_request(tenant, thread_id="decided-earliest")
    now = timezone.now()
    ApprovalRequest.objects.filter(pk=late.pk).update(
        due_at=now + datetime.timedelta(hours=5)
    )
    ApprovalRequest.objects.filter(pk=soon.pk).update(
        due_at=now + datetime.timedelta(hours=1)
    )
    ApprovalRequest.objects.filter(pk=decided.pk).update(
        status="approved", due_at=now - datetime.timedelta(hours=3)
    )

    html = logged_in(reviewer).get(QUEUE).content.decode()

    assert _thread_ids_in_order(html) == ["due-soon", "due-late", "decided-earliest"]


def test_queue_rows_show_the_decrypted_args_age_and_time_left(tenant, reviewer):
    approval = waiting_request(tenant, amount="120.00", thread_id="case-args")
    ApprovalRequest.objects.filter(pk=approval.pk).update(
        created_at=timezone.now() - datetime.timedelta(hours=2, minutes=5),
        due_at=timezone.now() + datetime.timedelta(hours=5, minutes=30),
        escalation_level=1,
    )
    html = logged_in(reviewer).get(QUEUE).content.decode()
    order_id = payload_of(approval)["args"]["order_id"]
    assert f"order_id={order_id}, amount=120.00, currency=EUR" in html
    assert "desk-risk-medium" in html
    assert "2 h 5 min" in html  # waiting
    assert re.search(r"escalates in 5 h (29|30) min", html)
    assert '<td class="field-escalation">1</td>' in html
    assert "refund_order" in html


def test_queue_marks_overdue_requests(tenant, reviewer):
    approval = waiting_request(tenant)
    ApprovalRequest.objects.filter(pk=approval.pk).update(
        due_at=timezone.now() - datetime.timedelta(minutes=20)
    )
    html = logged_in(reviewer).get(QUEUE).content.decode()
    assert re.search(r'class="desk-overdue">overdue (19|20) min', html)


def test_queue_has_no_bulk_actions_and_requests_cannot_be_deleted(tenant, reviewer):
    approval = waiting_request(tenant)
    client = logged_in(reviewer)
    html = client.get(QUEUE).content.decode()
    assert 'name="action"' not in html and "action-checkbox" not in html
    delete = f"/admin/approvals/approvalrequest/{approval.pk}/delete/"
    assert client.post(delete, {"post": "yes"}).status_code == 403
    assert ApprovalRequest.objects.filter(pk=approval.pk).exists()


def test_queue_filters_by_risk_and_escalation_and_searches_thread_ids(tenant, reviewer):
    waiting_request(tenant, amount="40.00", thread_id="small")
    big = waiting_request(tenant, amount="900.00", thread_id="big")
    ApprovalRequest.objects.filter(pk=big.pk).update(escalation_level=2)
    client = logged_in(reviewer)

    def listed(query: str) -> list[str]:
        return _thread_ids_in_order(client.get(QUEUE + query).content.decode())

    assert listed("?risk__exact=high") == ["big"]
    assert listed("?risk__exact=low") == ["small"]
    assert listed("?escalated=yes") == ["big"]
    assert listed("?escalated=no") == ["small"]
    assert listed("?q=small") == ["small"]
    assert listed("?q=refund") == ["big", "small"]  # high risk is due sooner
    assert listed("?status__exact=approved") == []


def test_queue_page_query_count_does_not_grow_with_the_queue(tenant, reviewer):
    client = logged_in(reviewer)
    waiting_request(tenant)
    client.get(QUEUE)  # warm caches that are per process, not per page
    with CaptureQueriesContext(connection) as few:
        assert client.get(QUEUE).status_code == 200
    for _ in range(12):
        waiting_request(tenant)
    with CaptureQueriesContext(connection) as many:
        html = client.get(QUEUE).content.decode()
    assert len(_thread_ids_in_order(html)) == 13
    assert len(many) == len(few) <= 15


def test_request_page_shows_the_card_and_records_the_opening(tenant, reviewer):
    approval = waiting_request(tenant, amount="120.00")
    payload = payload_of(approval)
    response, opening_id = open_card(logged_in(reviewer), approval)
    html = response.content.decode()
    for text in [payload["reason"], payload["affects"], payload["if_denied"]]:
        assert text in html
    args = re.search(r'id="desk-args">(.*?)</table>', html, re.S)[1]
    assert re.search(r"<th[^>]*>amount</th><td[^>]*>120.00</td>", args)
    assert re.search(r"<th[^>]*>order_id</th><td[^>]*>A-\d+</td>", args)
    assert "Waiting for" in html and "Escalates" in html
    assert 'name="csrfmiddlewaretoken"' in html
    opening = RequestOpening.objects.get(pk=opening_id)
    assert opening.user == reviewer and opening.request_id == approval.pk
    assert opening.content_hash == card_hash(response.context["card"])
    assert payload["reason"].encode() not in bytes(opening.card)  # ciphertext


def test_request_page_is_get_only_and_deciding_is_post_only(tenant, reviewer):
    approval = waiting_request(tenant)
    client = logged_in(reviewer)
    assert client.post(card_url(approval), {"verdict": "approve"}).status_code == 405
    assert client.get(decide_url(approval)).status_code == 405
    assert not Decision.objects.exists()


def test_deciding_needs_the_csrf_token(tenant, reviewer):
    approval = waiting_request(tenant)
    client = logged_in(reviewer, enforce_csrf_checks=True)
    _, opening_id = open_card(client, approval)
    response = client.post(
        decide_url(approval), {"verdict": "approve", "opening": opening_id}
    )
    assert response.status_code == 403
    assert not Decision.objects.exists()


def test_deny_without_a_note_is_refused_on_the_page(tenant, reviewer):
    approval = waiting_request(tenant)
    client = logged_in(reviewer)
    _, opening_id = open_card(client, approval)
    response = client.post(
        decide_url(approval), {"verdict": "deny", "note": "  ", "opening": opening_id}
    )
    assert response.status_code == 400
    assert "A denial needs a note" in response.content.decode()
    assert not Decision.objects.exists()
    approval.refresh_from_db()
    assert approval.status == "pending"


def test_deny_with_a_note_resumes_the_run_with_the_denial(tenant, reviewer):
    approval = waiting_request(tenant)
    client = logged_in(reviewer)
    _, opening_id = open_card(client, approval)
    response = client.post(
        decide_url(approval),
        {
            "verdict": "deny",
            "note": "Outside the refund window.",
            "opening": opening_id,
        },
        follow=True,
    )
    assert "Denied. The run resumes" in response.content.decode()
    approval.refresh_from_db()
    assert approval.status == "denied"
    resume = Run.objects.get(thread=approval.thread, kind="resume")
    value = ThreadCipher.for_thread(approval.thread).decrypt_value(
        resume.resume, row=("run-resume", str(resume.id))
    )
    assert value[approval.interrupt_id]["approved"] is False
    assert value[approval.interrupt_id]["note"] == "Outside the refund window."
    assert value[approval.interrupt_id]["reviewer"] == reviewer.username


def test_approving_stores_a_snapshot_of_the_card_the_reviewer_saw(tenant, reviewer):
    approval = waiting_request(tenant)
    client = logged_in(reviewer)
    response, opening_id = open_card(client, approval)
    shown = response.context["card"]
    response = client.post(
        decide_url(approval), {"verdict": "approve", "opening": opening_id}
    )
    assert response.status_code == 302
    approval.refresh_from_db()
    assert approval.status == "approved"
    assert Run.objects.filter(thread=approval.thread, kind="resume").count() == 1
    decision = Decision.objects.get(request=approval)
    snapshot = DecisionSnapshot.objects.get(decision=decision)
    cipher = ThreadCipher.for_thread(approval.thread)
    card = snapshot_card(snapshot, cipher)
    assert card == shown
    assert snapshot.content_hash == card_hash(shown)
    assert snapshot.first_opened_at <= decision.created_at
    assert card["reason"] == payload_of(approval)["reason"]
    assert card["reason"].encode() not in bytes(snapshot.card)
    decided = AuditEvent.objects.for_tenant(tenant).get(kind="approval.decided")
    assert decided.actor_label == reviewer.username


def test_the_snapshot_is_the_card_as_opened_not_as_it_is_at_decision_time(
    tenant, reviewer
):
    """What the reviewer saw: a card opened earlier is kept, even if the
    request changed (here: escalated) between opening and deciding."""
    approval = waiting_request(tenant)
    client = logged_in(reviewer)
    response, opening_id = open_card(client, approval)
    ApprovalRequest.objects.filter(pk=approval.pk).update(escalation_level=3)
    client.post(decide_url(approval), {"verdict": "approve", "opening": opening_id})
    snapshot = DecisionSnapshot.objects.get()
    card = snapshot_card(snapshot, ThreadCipher.for_thread(approval.thread))
    assert card["escalation_level"] == 0
    assert snapshot.opening_id is not None and str(snapshot.opening_id) == opening_id


def test_approve_with_edited_args_records_the_edit_beside_the_original(
    tenant, reviewer
):
    approval = waiting_request(tenant, amount="120.00")
    client = logged_in(reviewer)
    response, opening_id = open_card(client, approval)
    form = response.context["edit_form"]
    names = {field.label: field.html_name for field in form.arg_fields()}
    assert form[names["amount"]].value() == "120.00"  # prefilled
    original = payload_of(approval)["args"]
    post = {names[key]: value for key, value in original.items()}
    post.update(
        {
            names["amount"]: "80.00",
            "form": "edit",
            "note": "Partial refund: one item kept.",
            "opening": opening_id,
        }
    )
    assert client.post(decide_url(approval), post).status_code == 302
    decision = Decision.objects.get(request=approval)
    cipher = ThreadCipher.for_thread(approval.thread)
    assert decision.args_edited is True
    assert decision_detail(decision, cipher)["args"] == {**original, "amount": "80.00"}
    assert payload_of(approval)["args"] == original
    html = client.get(card_url(approval)).content.decode()
    assert "80.00" in html and "120.00" in html


def test_edited_args_that_change_nothing_are_refused(tenant, reviewer):
    approval = waiting_request(tenant)
    client = logged_in(reviewer)
    response, opening_id = open_card(client, approval)
    form = response.context["edit_form"]
    post = {f.html_name: f.value() for f in form.arg_fields()}
    post.update({"form": "edit", "opening": opening_id})
    response = client.post(decide_url(approval), post)
    assert response.status_code == 400
    assert "The arguments are unchanged" in response.content.decode()
    assert not Decision.objects.exists()


def test_high_risk_needs_a_second_different_reviewer(tenant, reviewer):
    second = make_member(tenant, role="reviewer").user
    approval = waiting_request(tenant, amount="900.00")
    assert approval.required_approvals == 2
    first_client = logged_in(reviewer)
    _, opening_id = open_card(first_client, approval)
    response = first_client.post(
        decide_url(approval), {"verdict": "approve", "opening": opening_id}, follow=True
    )
    html = response.content.decode()
    assert "a second, different reviewer must approve" in html
    assert f'id="desk-first-approver">{reviewer.username}<' in html
    approval.refresh_from_db()
    assert approval.status == "pending"

    _, again = open_card(first_client, approval)
    response = first_client.post(
        decide_url(approval), {"verdict": "approve", "opening": again}
    )
    assert response.status_code == 409
    assert "you already approved this request" in response.content.decode()
    assert Decision.objects.filter(request=approval).count() == 1

    second_client = logged_in(second)
    page, opening_id = open_card(second_client, approval)
    assert f'id="desk-first-approver">{reviewer.username}<' in page.content.decode()
    response = second_client.post(
        decide_url(approval), {"verdict": "approve", "opening": opening_id}, follow=True
    )
    assert "Approved. The run resumes" in response.content.decode()
    approval.refresh_from_db()
    assert approval.status == "approved"
    assert DecisionSnapshot.objects.filter(decision__request=approval).count() == 2


def test_an_opening_of_another_reviewer_is_not_accepted(tenant, reviewer):
    other = make_member(tenant, role="reviewer").user
    approval = waiting_request(tenant)
    _, foreign_opening = open_card(logged_in(other), approval)
    response = logged_in(reviewer).post(
        decide_url(approval), {"verdict": "approve", "opening": foreign_opening}
    )
    assert response.status_code == 302
    assert not Decision.objects.exists()


def test_deciding_a_decided_request_shows_the_conflict(tenant, reviewer):
    approval = waiting_request(tenant)
    client = logged_in(reviewer)
    _, opening_id = open_card(client, approval)
    other = logged_in(make_member(tenant, role="reviewer").user)
    _, other_opening = open_card(other, approval)
    other.post(decide_url(approval), {"verdict": "approve", "opening": other_opening})
    response = client.post(
        decide_url(approval), {"verdict": "deny", "note": "no", "opening": opening_id}
    )
    assert response.status_code == 409
    assert "already approved" in response.content.decode()
    assert Decision.objects.filter(request=approval).count() == 1


def test_a_shredded_threads_request_says_its_content_is_gone(tenant, reviewer):
    approval = waiting_request(tenant, thread_id="shredded")
    client = logged_in(reviewer)
    _, opening_id = open_card(client, approval)
    storage.threads_shred(thread_pks=[approval.thread_id])

    queue = client.get(QUEUE).content.decode()
    assert re.search(r'class="desk-unreadable">content deleted<', queue)
    page = client.get(card_url(approval))
    html = page.content.decode()
    assert page.status_code == 200
    assert "this request&#x27;s content is gone" in html
    assert 'id="desk-approve"' not in html
    response = client.post(
        decide_url(approval), {"verdict": "approve", "opening": opening_id}
    )
    assert "content is gone" in response.content.decode()
    assert not Decision.objects.exists()
