"""Plan review on the desk (the admin card, no browser): the plan is a
numbered list; the page's forms cannot approve anything but a plan change the
gate's rules allow, whatever is posted."""

from __future__ import annotations

import json

import pytest

from approvals.models import Decision
from runs.models import Run
from tests.approvals.helpers import decide_url, logged_in, open_card
from tests.approvals.plan_helpers import NOTE, waiting_plan
from tests.factories import make_member, make_tenant

pytestmark = pytest.mark.django_db


@pytest.fixture
def tenant():
    return make_tenant()


def plan_post(response, opening_id, *, note=NOTE, **changes) -> dict:
    """The plan form as the page filled it, with some fields changed."""
    form = response.context["plan_form"]
    post = {
        field.html_name: field.value()
        for _, keep, fields in form.step_rows()
        for field in [keep, *fields]
        if field.value() not in (False, None)
    }
    post.update(changes)
    return {**post, "form": "plan", "note": note, "opening": opening_id}


def assert_nothing_decided(approval):
    approval.refresh_from_db()
    assert approval.status == "pending"
    assert not Decision.objects.filter(request=approval).exists()
    assert not Run.objects.filter(kind="resume").exists()


def test_the_card_numbers_the_plan_and_offers_no_args_edit(tenant):
    approval = waiting_plan(tenant)
    response, _ = open_card(logged_in(make_member(tenant).user), approval)
    html = response.content.decode()
    assert '<ol class="desk-plan-steps">' in html
    assert '<li value="3"' in html and "notify_customer" in html
    assert response.context["can_edit"] is False  # no "edited arguments" form
    assert [step["editable"] for step in response.context["card"]["plan"]["steps"]] == [
        ["quantity"],
        ["amount"],
        ["channel"],
    ]


def test_a_plan_change_the_rules_refuse_is_a_form_error_on_its_field(tenant):
    approval = waiting_plan(tenant)
    client = logged_in(make_member(tenant).user)
    page, opening_id = open_card(client, approval)
    response = client.post(
        decide_url(approval), plan_post(page, opening_id, step_2_arg_1="-5")
    )
    assert response.status_code == 400
    form = response.context["plan_form"]
    assert "step 2: amount: Input should be greater than 0" in " ".join(
        form["step_2_arg_1"].errors
    )
    empty = plan_post(page, opening_id)
    for number in (1, 2, 3):
        empty.pop(f"keep_{number}")
    response = client.post(decide_url(approval), empty)
    assert response.status_code == 400
    assert "removing every step leaves nothing to approve" in " ".join(
        response.context["plan_form"].non_field_errors()
    )
    assert_nothing_decided(approval)


def test_an_args_edit_posted_on_a_plan_is_refused(tenant):
    approval = waiting_plan(tenant)
    client = logged_in(make_member(tenant).user)
    _, opening_id = open_card(client, approval)
    forged = {
        "form": "edit",
        "arg_0": json.dumps({"steps": []}),
        "note": NOTE,
        "opening": opening_id,
    }
    response = client.post(decide_url(approval), forged)
    assert response.status_code == 400
    assert "asks approval for a plan" in response.context["error"]
    assert_nothing_decided(approval)


def test_a_plan_approved_on_the_desk_with_a_step_removed_resumes_with_the_rest(
    tenant,
):
    approval = waiting_plan(tenant)
    client = logged_in(make_member(tenant).user)
    page, opening_id = open_card(client, approval)
    post = plan_post(page, opening_id)
    post.pop("keep_2")
    response = client.post(decide_url(approval), post)
    assert response.status_code == 302
    approval.refresh_from_db()
    assert approval.status == "approved"
    card = open_card(client, approval)[0].context["card"]
    assert card["plan"]["changes"] == ["step 2 charge_card removed"]
    assert [step["removed"] for step in card["plan"]["steps"]] == [False, True, False]
