"""Plan review on the real worker, with the docs' plan agent (`doc-plan`,
docs/writing-agents.md): the run carries out exactly the approved plan, a
high-risk step still stops at its own gate, and no path walks past the plan
gate."""

import pytest

from approvals.models import ApprovalRequest
from runs.models import Run, Thread
from tests.approvals.plan_helpers import NOTE, decide, running_plan
from tests.durable.helpers import state, wait_run
from tests.factories import (
    api_client,
    make_api_key,
    make_member,
    make_tenant,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


def clients(tenant):
    """A `runs` key with time travel; two reviewers' personal keys."""
    runs = api_client(make_api_key(tenant, ["runs", "time_travel"])[1])
    alice, bob = (
        api_client(make_api_key(tenant, ["approvals"], user=user)[1])
        for user in (make_member(tenant).user, make_member(tenant).user)
    )
    return runs, alice, bob


def done(client, thread_id):
    return [
        (entry["step"], entry["action"], entry["args"])
        for entry in state(client, thread_id).get("done") or []
    ]


def test_plan_approved_with_a_step_removed_runs_exactly_the_rest(worker):
    tenant = make_tenant()
    runs, alice, _ = clients(tenant)
    request = running_plan(runs, "order-1", amount="80.00", quantity=2)
    assert done(runs, "order-1") == []  # nothing runs before the plan's approval

    response = decide(
        alice,
        request,
        note=NOTE,
        plan={"remove": [3], "args": {"1": {"sku": "BLENDER-1", "quantity": 1}}},
    )
    assert response.status_code == 200, response.content
    assert wait_run(response.json()["resumed_run"]["run_id"]).status == "succeeded"
    assert done(runs, "order-1") == [
        (1, "reserve_stock", {"sku": "BLENDER-1", "quantity": 1}),
        (2, "charge_card", {"order_id": "O-1", "amount": "80.00"}),
    ]
    decision = state(runs, "order-1")["review"]
    assert [edit.get("removed", False) for edit in decision["edits"]] == [False, True]


def test_a_denied_plan_runs_no_step(worker):
    tenant = make_tenant()
    runs, alice, _ = clients(tenant)
    request = running_plan(runs, "order-2")
    response = decide(alice, request, approved=False, note="Out of stock.")
    assert wait_run(response.json()["resumed_run"]["run_id"]).status == "succeeded"
    assert done(runs, "order-2") == []


def test_a_high_risk_step_still_stops_at_its_own_gate_after_the_plan(worker):
    tenant = make_tenant()
    runs, alice, bob = clients(tenant)
    plan = running_plan(runs, "order-3", amount="900.00")
    assert (plan.risk, plan.required_approvals) == ("high", 2)
    assert decide(alice, plan).json()["resumed_run"] is None  # 1 of 2
    resumed = decide(bob, plan).json()["resumed_run"]["run_id"]
    assert wait_run(resumed).status == "interrupted"

    # Stock is reserved; the charge waits on its own request, two people again.
    assert done(runs, "order-3") == [
        (1, "reserve_stock", {"sku": "BLENDER-1", "quantity": 2})
    ]
    charge = ApprovalRequest.objects.get(thread__thread_id="order-3", gate="action")
    assert (charge.action, charge.risk, charge.required_approvals) == (
        "charge_card",
        "high",
        2,
    )
    assert decide(alice, charge).json()["resumed_run"] is None
    resumed = decide(bob, charge).json()["resumed_run"]["run_id"]
    assert wait_run(resumed).status == "succeeded"
    assert [action for _, action, _ in done(runs, "order-3")] == [
        "reserve_stock",
        "charge_card",
        "notify_customer",
    ]


def assert_plan_gate_held(response, request, runs, thread_id):
    assert response.status_code == 409, response.content
    assert response.json()["code"] == "approval_required"
    request.refresh_from_db()
    assert request.status == "pending" and not request.decisions.exists()
    assert Thread.objects.get(thread_id=thread_id).status == "interrupted"
    assert not Run.objects.filter(thread__thread_id=thread_id, kind="resume").exists()
    assert done(runs, thread_id) == []


def test_no_raw_resume_or_fork_walks_past_the_plan_gate(worker):
    tenant = make_tenant()
    runs, _, _ = clients(tenant)
    request = running_plan(runs, "order-4")
    approving = {
        "approved": True,
        "note": "",
        "reviewer": "me",
        "approval_id": str(request.pk),
        "args": {"steps": []},
        "edits": [],
    }
    raw = runs.post(
        "/api/v1/threads/order-4/resume", {"resume": approving}, format="json"
    )
    assert_plan_gate_held(raw, request, runs, "order-4")
    assert raw.json()["pending_approvals"] == [str(request.pk)]

    keyed = runs.post(
        "/api/v1/threads/order-4/resume",
        {"resume": {request.interrupt_id: approving}},
        format="json",
    )
    assert_plan_gate_held(keyed, request, runs, "order-4")

    history = runs.get("/api/v1/threads/order-4/history").json()["results"]
    at_gate = next(e["checkpoint_id"] for e in history if e["next"] == ["review_plan"])
    for as_node, values in [
        ("review_plan", {"review": approving, "cursor": 0}),
        ("run_step", {"cursor": 0}),
        (None, {"review": approving}),
    ]:
        body = {"checkpoint_id": at_gate, "values": values}
        if as_node:
            body["as_node"] = as_node
        forked = runs.post("/api/v1/threads/order-4/fork", body, format="json")
        assert_plan_gate_held(forked, request, runs, "order-4")
