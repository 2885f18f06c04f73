"""Plan review over REST, without running the agent: a plan gate's steps are
numbered and judged when it opens; a reviewer's change (steps removed,
arguments edited) obeys the gate's rules: validated against each step's
schema (400 naming the step and the argument), a note, the risk recomputed
(removing steps never raises it, an edit can), the change recorded beside
the agent's plan and shown old -> new."""

import uuid

import pytest
from langgraph.types import Interrupt

from approvals.content import payload_of, resume_value_of
from approvals.models import Decision
from approvals.services import approval_requests_open
from audit.models import AuditEvent
from runs.crypto import ThreadCipher
from runs.models import Run
from runs.signals import InterruptRejected
from tests.approvals.helpers import waiting_request
from tests.approvals.plan_helpers import (
    NOTE,
    decide,
    order,
    plan_payload,
    waiting_plan,
)
from tests.factories import api_client, make_api_key, make_member, make_tenant

pytestmark = pytest.mark.django_db


@pytest.fixture
def tenant():
    return make_tenant()


def person(tenant):
    user = make_member(tenant, role="reviewer").user
    return api_client(make_api_key(tenant, ["approvals"], user=user)[1]), user


def assert_untouched(approval, risk="medium"):
    approval.refresh_from_db()
    assert approval.status == "pending" and approval.risk == risk
    assert not Decision.objects.filter(request=approval).exists()
    assert not Run.objects.filter(kind="resume").exists()


def test_a_plan_opens_numbered_with_each_steps_risk(tenant):
    approval = waiting_plan(tenant, amount="80.00")
    assert (approval.gate, approval.risk, approval.required_approvals) == (
        "plan",
        "medium",  # reserve_stock declares no risk rule: medium
        1,
    )
    client, _ = person(tenant)
    body = client.get(f"/api/v1/approvals/{approval.pk}").json()
    steps = body["args"]["steps"]
    assert [(s["step"], s["action"], s["risk"]) for s in steps] == [
        (1, "reserve_stock", "medium"),
        (2, "charge_card", "low"),
        (3, "notify_customer", "medium"),
    ]
    assert steps[0]["reason"] == "why" and body["edits"] == []


def test_a_plan_with_a_high_risk_step_needs_two_people(tenant):
    approval = waiting_plan(tenant, amount="900.00")
    assert (approval.risk, approval.required_approvals) == ("high", 2)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"steps": []}, "non-empty list of steps"),
        ({"steps": [{"action": "charge_card", "args": {}}]}, "step 1 lacks reason"),
        ({"steps": "all of them"}, 'args must be {"steps": [...]}'),
    ],
)
def test_a_plan_that_breaks_the_contract_fails_the_run_naming_it(
    tenant, change, message
):
    payload = {**plan_payload(order()), "args": change}
    with pytest.raises(InterruptRejected, match=message.replace("[", r"\[")):
        waiting_plan(tenant, payload=payload)


def test_a_plan_step_that_breaks_its_actions_schema_fails_the_run(tenant):
    payload = plan_payload(order(amount="abc"))
    with pytest.raises(InterruptRejected, match="step 2 the arguments of charge_card"):
        waiting_plan(tenant, payload=payload)


def test_approved_with_a_step_removed_and_an_edit_records_both_beside_the_plan(
    tenant,
):
    approval = waiting_plan(tenant, amount="80.00")
    client, alice = person(tenant)
    response = decide(
        client,
        approval,
        note=NOTE,
        plan={"remove": [3], "args": {"1": {"sku": "BLENDER-1", "quantity": 1}}},
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "approved"
    assert [s["step"] for s in body["args"]["steps"]] == [1, 2]
    assert body["args"]["steps"][0]["args"]["quantity"] == 1
    assert [s["step"] for s in body["payload"]["args"]["steps"]] == [1, 2, 3]
    diff = [
        {
            "step": 1,
            "action": "reserve_stock",
            "arg": "quantity",
            "old": 2,
            "new": 1,
        },
        {
            "step": 3,
            "action": "notify_customer",
            "removed": True,
            "arg": None,
            "old": {"order_id": "O-1", "channel": "email"},
            "new": None,
        },
    ]
    assert body["edits"] == diff and body["decisions"][0]["edits"] == diff

    approval.refresh_from_db()
    resume = resume_value_of(approval, ThreadCipher.for_thread(approval.thread))
    assert [s["step"] for s in resume["args"]["steps"]] == [1, 2]
    assert resume["edits"] == diff
    # The agent's plan is kept as it asked.
    assert len(payload_of(approval)["args"]["steps"]) == 3
    summary = AuditEvent.objects.get(kind="approval.decided").summary
    assert summary == (
        f"fulfil_order approved by {alice.username}; edited step 1 reserve_stock "
        "quantity 2 → 1; step 3 notify_customer removed"
    )


def test_invalid_argument_of_a_step_is_400_naming_the_step_and_argument(tenant):
    approval = waiting_plan(tenant)
    client, _ = person(tenant)
    response = decide(
        client,
        approval,
        note=NOTE,
        plan={"args": {"1": {"sku": "BLENDER-1", "quantity": "abc"}}},
    )
    assert response.status_code == 400
    fields = response.json()["fields"]
    assert list(fields) == ["plan"]
    assert "valid integer" in fields["plan"]["args"]["1"]["quantity"][0]
    assert_untouched(approval)


def test_beyond_the_declared_bounds_and_non_editable_are_400(tenant):
    approval = waiting_plan(tenant)
    client, _ = person(tenant)
    response = decide(
        client,
        approval,
        note=NOTE,
        plan={
            "args": {
                "1": {"sku": "OTHER", "quantity": 500},
                "2": {"order_id": "O-1", "amount": "-1"},
            }
        },
    )
    assert response.status_code == 400
    args = response.json()["fields"]["plan"]["args"]
    assert "less than or equal to 100" in args["1"]["quantity"][0]
    assert "greater than 0" in args["2"]["amount"][0]
    response = decide(
        client,
        approval,
        note=NOTE,
        plan={"args": {"1": {"sku": "OTHER", "quantity": 2}}},
    )
    assert response.json()["fields"]["plan"]["args"]["1"]["sku"] == [
        "sku cannot be edited (editable: quantity)"
    ]
    assert_untouched(approval)


@pytest.mark.parametrize(
    ("plan", "where", "message"),
    [
        ({"remove": [7]}, ["remove"], "step(s) 7 not in the plan (its steps: 1, 2, 3)"),
        (
            {"remove": [1, 2, 3]},
            ["remove"],
            "removing every step leaves nothing to approve: deny the plan instead",
        ),
        (
            {"remove": [2], "args": {"2": {"order_id": "O-1", "amount": "1.00"}}},
            ["args", "2"],
            "step 2 is removed: it has no arguments",
        ),
        ({"args": {"9": {}}}, ["args", "9"], "step 9 is not in the plan"),
    ],
)
def test_removals_the_plan_cannot_take_are_400(tenant, plan, where, message):
    approval = waiting_plan(tenant)
    client, _ = person(tenant)
    response = decide(client, approval, note=NOTE, plan=plan)
    assert response.status_code == 400, response.content
    found = response.json()["fields"]["plan"]
    for key in where:
        found = found[key]
    assert found[0].startswith(message)
    assert_untouched(approval)


def test_a_change_without_a_note_is_400_naming_the_note(tenant):
    approval = waiting_plan(tenant)
    client, _ = person(tenant)
    response = decide(client, approval, plan={"remove": [3]})
    assert response.status_code == 400
    assert "needs a note" in response.json()["fields"]["note"][0]
    assert_untouched(approval)


def test_args_on_a_plan_and_plan_on_an_action_are_400(tenant):
    approval = waiting_plan(tenant)
    client, _ = person(tenant)
    response = decide(client, approval, note=NOTE, args={"steps": []})
    assert "asks approval for a plan" in response.json()["fields"]["args"][0]
    assert_untouched(approval)
    action = waiting_request(tenant, amount="30.00")
    response = decide(client, action, note=NOTE, plan={"remove": [1]})
    assert "not a plan" in response.json()["fields"]["plan"][0]
    assert_untouched(action, risk="low")


def test_removing_steps_never_lowers_the_approvals_needed(tenant):
    approval = waiting_plan(tenant, amount="900.00")
    client, _ = person(tenant)
    body = decide(client, approval, note=NOTE, plan={"remove": [2]}).json()
    assert body["status"] == "pending"
    assert (body["risk"], body["required_approvals"]) == ("high", 2)


def test_an_edit_that_raises_the_plans_risk_waits_for_a_second_reviewer(tenant):
    approval = waiting_plan(tenant, amount="80.00")
    first, alice = person(tenant)
    edit = {"2": {"order_id": "O-1", "amount": "700.00"}}
    body = decide(first, approval, note=NOTE, plan={"args": edit}).json()
    assert (body["status"], body["risk"], body["required_approvals"]) == (
        "pending",
        "high",
        2,
    )
    assert body["args"]["steps"][1]["risk"] == "high"
    again = decide(first, approval)
    assert again.status_code == 409 and again.json()["code"] == "same_reviewer"

    second, _ = person(tenant)
    seen = second.get(f"/api/v1/approvals/{approval.pk}").json()
    assert seen["edits"] == [
        {
            "step": 2,
            "action": "charge_card",
            "arg": "amount",
            "old": "80.00",
            "new": "700.00",
        }
    ]
    assert decide(second, approval).json()["status"] == "approved"
    summary = (
        AuditEvent.objects.filter(kind="approval.decided").order_by("seq").first()
    ).summary
    assert summary.endswith(
        "edited step 2 charge_card amount 80.00 → 700.00 (now high risk)"
    )


def test_a_plan_gate_of_an_agent_without_declarations_opens_medium(tenant):
    approval = waiting_request(tenant)
    payload = plan_payload(order())
    (request,) = approval_requests_open(
        run=approval.run, interrupts=[Interrupt(value=payload, id=uuid.uuid4().hex)]
    )
    # The refund agent declares none of these actions: stated risks only.
    assert (request.gate, request.risk) == ("plan", "medium")
