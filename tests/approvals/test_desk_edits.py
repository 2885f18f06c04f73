"""Approve with edited arguments on the desk: the action's declaration decides
what may change, each refusal is a form error on its field, and an edit that
raises the risk waits for a second reviewer, who sees it."""

from __future__ import annotations

import pytest

from approvals.cards import snapshot_card
from approvals.desk_models import DecisionSnapshot
from approvals.models import Decision
from runs.crypto import ThreadCipher
from tests.approvals.helpers import (
    card_url,
    decide_url,
    logged_in,
    open_card,
    waiting_request,
)
from tests.factories import make_member, make_tenant

pytestmark = pytest.mark.django_db

NOTE = "One item is kept: refund what came back."


@pytest.fixture
def tenant():
    return make_tenant()


def edit_post(response, opening_id, *, note=NOTE, **changes) -> dict:
    """The edit form as the page filled it, with some arguments changed."""
    form = response.context["edit_form"]
    post = {field.html_name: field.value() for field in form.arg_fields()}
    names = {field.label: field.html_name for field in form.arg_fields()}
    post.update({names[key]: value for key, value in changes.items()})
    return {**post, "form": "edit", "note": note, "opening": opening_id}


def field_errors(response, label: str) -> str:
    form = response.context["edit_form"]
    (field,) = [f for f in form.arg_fields() if f.label == label]
    return " ".join(field.errors)


def test_only_editable_arguments_are_editable_on_the_page(tenant):
    approval = waiting_request(tenant, amount="30.00")
    response, _ = open_card(logged_in(make_member(tenant).user), approval)
    html = response.content.decode()
    form = response.context["edit_form"]
    readonly = {f.label: "readonly" in f.field.widget.attrs for f in form.arg_fields()}
    assert readonly == {"order_id": True, "amount": False, "currency": True}
    assert "Not editable: the agent declares this argument fixed." in html


def test_an_invalid_value_is_a_form_error_on_its_field(tenant):
    approval = waiting_request(tenant, amount="30.00")
    client = logged_in(make_member(tenant).user)
    page, opening_id = open_card(client, approval)
    response = client.post(
        decide_url(approval), edit_post(page, opening_id, amount="abc")
    )
    assert response.status_code == 400
    assert "valid decimal" in field_errors(response, "amount")
    assert not Decision.objects.exists()


def test_a_changed_non_editable_argument_is_a_form_error_on_its_field(tenant):
    """Read-only on the page; a forged POST is refused by the service."""
    approval = waiting_request(tenant, amount="30.00")
    client = logged_in(make_member(tenant).user)
    page, opening_id = open_card(client, approval)
    post = edit_post(page, opening_id, order_id="A-9999")
    response = client.post(decide_url(approval), post)
    assert response.status_code == 400
    assert "order_id cannot be edited" in field_errors(response, "order_id")
    assert not Decision.objects.exists()


def test_an_edit_without_a_note_is_refused(tenant):
    approval = waiting_request(tenant, amount="30.00")
    client = logged_in(make_member(tenant).user)
    page, opening_id = open_card(client, approval)
    post = edit_post(page, opening_id, note="", amount="20.00")
    response = client.post(decide_url(approval), post)
    assert response.status_code == 400
    errors = response.context["edit_form"].errors["note"]
    assert errors == ["An edit needs a note that says why the arguments changed."]
    assert not Decision.objects.exists()


def test_an_edit_that_raises_the_risk_waits_for_a_second_reviewer_who_sees_it(
    tenant,
):
    approval = waiting_request(tenant, amount="30.00")
    first = make_member(tenant, username="alice").user
    client = logged_in(first)
    page, opening_id = open_card(client, approval)
    response = client.post(
        decide_url(approval), edit_post(page, opening_id, amount="900.00"), follow=True
    )
    html = response.content.decode()
    assert "a second, different reviewer must approve" in html
    approval.refresh_from_db()
    assert (approval.status, approval.risk, approval.required_approvals) == (
        "pending",
        "high",
        2,
    )

    second = logged_in(make_member(tenant, username="bob").user)
    page, opening_id = open_card(second, approval)
    card = page.context["card"]
    assert card["args"]["amount"] == "900.00"
    assert card["edits"] == [{"arg": "amount", "old": "30.00", "new": "900.00"}]
    html = page.content.decode()
    assert "amount 30.00 → 900.00" in html
    assert "<del>30.00</del> → <ins>900.00</ins>" in html
    response = second.post(
        decide_url(approval), {"verdict": "approve", "opening": opening_id}
    )
    assert response.status_code == 302
    approval.refresh_from_db()
    assert approval.status == "approved"
    # What bob decided on is kept: the card with the edit on it.
    snapshot = DecisionSnapshot.objects.get(decision__reviewer_user__username="bob")
    seen = snapshot_card(snapshot, ThreadCipher.for_thread(approval.thread))
    assert seen["edits"] == card["edits"]
    final = second.get(card_url(approval)).content.decode()
    assert "with edits: amount 30.00 → 900.00" in final
