"""The queue as a record: who decided and when, the filters by reviewer and
decision, the search over safe arguments, and the CSV export."""

from __future__ import annotations

import csv
import io

import pytest

from approvals.content import payload_of
from approvals.models import ApprovalRequest
from approvals.queue import safe_args_text
from approvals.services import Reviewer, approval_decide
from tests.approvals.helpers import QUEUE, listed, logged_in, waiting_request
from tests.factories import make_member, make_tenant

pytestmark = pytest.mark.django_db

EXPORT = QUEUE + "export.csv"


@pytest.fixture
def tenant():
    return make_tenant()


@pytest.fixture
def people(tenant):
    return {
        name: make_member(tenant, role="reviewer", username=name).user
        for name in ("rita", "sam")
    }


def decide(approval, user, approved=True, note="checked"):
    return approval_decide(
        approval=approval,
        reviewer=Reviewer.for_user(user),
        approved=approved,
        note=note,
    )


def exported(client, query: str = "") -> list[dict[str, str]]:
    response = client.get(EXPORT + query)
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    body = b"".join(response.streaming_content).decode()
    return list(csv.DictReader(io.StringIO(body)))


def test_safe_args_text_names_only_the_declared_safe_scalars():
    args = {"order_id": "A-1", "email": "a@example.com", "amount": "40.00"}
    assert safe_args_text(args, {"order_id", "amount"}) == "order_id=A-1 amount=40.00"
    # A nested value under a safe key is not clear text: left out.
    assert safe_args_text({"order_id": {"n": 1}}, {"order_id"}) == ""


def test_an_order_id_finds_its_request(tenant, people):
    first = waiting_request(tenant, thread_id="case-a")
    waiting_request(tenant, thread_id="case-b")
    order_id = payload_of(first)["args"]["order_id"]
    assert first.safe_args == f"order_id={order_id} amount=40.00 currency=EUR"

    assert listed(logged_in(people["rita"]), f"?q={order_id}") == ["case-a"]


def test_decided_rows_show_who_decided_and_when(tenant, people):
    approval = waiting_request(tenant, thread_id="case-decided")
    decide(approval, people["rita"], approved=False, note="not damaged")
    approval.refresh_from_db()

    html = logged_in(people["sam"]).get(QUEUE).content.decode()

    assert '<td class="field-decided_by">rita</td>' in html
    stamp = approval.decided_at.strftime(
        '<span class="desk-nowrap">%Y-%m-%d</span><br>%H:%M:%S UTC'
    )
    assert f'<td class="field-decided_at_text">{stamp}</td>' in html
    assert "not damaged" not in html  # notes stay on the card


def test_filters_by_reviewer_and_decision_mean_one_decision(tenant, people):
    rita, sam = people["rita"], people["sam"]
    denied_by_rita = waiting_request(tenant, thread_id="rita-denied")
    approved_by_rita = waiting_request(tenant, thread_id="rita-approved")
    denied_by_sam = waiting_request(tenant, thread_id="sam-denied")
    waiting_request(tenant, thread_id="undecided")
    decide(denied_by_rita, rita, approved=False)
    decide(approved_by_rita, rita)
    decide(denied_by_sam, sam, approved=False)
    client = logged_in(sam)

    by_rita = listed(client, f"?reviewer=user:{rita.pk}")
    assert sorted(by_rita) == ["rita-approved", "rita-denied"]
    assert listed(client, f"?reviewer=user:{rita.pk}&decision=denied") == [
        "rita-denied"
    ]
    assert sorted(listed(client, "?decision=denied")) == ["rita-denied", "sam-denied"]
    assert listed(client, "?decision=none") == ["undecided"]
    # Nonsense values filter everything out; they are not errors.
    assert listed(client, "?reviewer=user:nobody") == []


def test_the_title_says_queue_only_for_pending_requests(tenant, people):
    client = logged_in(people["rita"])
    assert client.get(QUEUE).context["title"] == "Approval requests"
    pending = client.get(QUEUE + "?status__exact=pending")
    assert pending.context["title"] == "Queue: requests waiting on a human"
    assert client.get(QUEUE + "?status__exact=approved").context["title"] == (
        "Approval requests"
    )


def test_export_is_the_filtered_list_with_the_audit_exports_rules(tenant, people):
    # A username may start with "@" or "+": a spreadsheet would run it.
    formula = make_member(tenant, role="reviewer", username="@SUM").user
    denied = waiting_request(tenant, thread_id="case-denied")
    waiting_request(tenant, thread_id="still-pending")
    decide(denied, formula, approved=False, note="a note is free text")
    client = logged_in(people["sam"])

    rows = exported(client, "?decision=denied")

    assert len(rows) == 1
    (row,) = rows
    assert row["thread_id"] == "case-denied"
    assert row["status"] == "denied"
    assert row["decided_by"] == "'@SUM"
    assert row["decisions"] == "'@SUM denied"
    assert row["safe_args"] == ApprovalRequest.objects.get(pk=denied.pk).safe_args
    assert row["decided_at"].endswith("Z")
    assert "a note is free text" not in str(rows)
    assert len(exported(client)) == 2


def test_the_export_sees_only_the_users_tenants(tenant, people):
    other = make_tenant()
    waiting_request(other, thread_id="elsewhere")
    waiting_request(tenant, thread_id="here")
    rows = exported(logged_in(people["rita"]))
    assert [row["thread_id"] for row in rows] == ["here"]


def test_the_export_refuses_who_may_not_see_the_queue(tenant):
    admin = make_member(tenant, role="tenant_admin").user
    assert logged_in(admin).get(EXPORT).status_code == 403


def test_an_unknown_filter_sends_the_export_back_to_the_queue(tenant, people):
    response = logged_in(people["rita"]).get(EXPORT + "?nonsense__in=1")
    assert response.status_code == 302
    assert response["Location"].endswith("?e=1")
