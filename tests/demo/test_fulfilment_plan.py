"""The bundled `fulfilment` agent asks approval for its whole plan first, and
carries out exactly the plan approved: on a real worker, over REST."""

import pytest

from approvals.models import ApprovalRequest
from demo.models import (
    DemoCharge,
    DemoCourierBooking,
    DemoOutboxMessage,
    DemoStockReservation,
)
from tests.demo.test_fulfilment import order
from tests.durable.helpers import start, state, wait_run
from tests.factories import tenant_with_client

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


def waiting_plan(client, thread_id: str, **extra) -> ApprovalRequest:
    run = wait_run(start(client, "fulfilment", thread_id, order(**extra)))
    assert run.status == "interrupted"
    assert not DemoStockReservation.objects.exists()  # nothing before the plan
    return ApprovalRequest.objects.get(thread__thread_id=thread_id, gate="plan")


def decide(client, request, **body):
    response = client.post(
        f"/api/v1/approvals/{request.pk}/decision", body, format="json"
    )
    assert response.status_code == 200, response.content
    return response.json()


def test_the_plan_is_numbered_and_explained_step_by_step(worker):
    _, client = tenant_with_client()
    request = waiting_plan(client, "ord-10")
    body = client.get(f"/api/v1/approvals/{request.pk}").json()
    assert (body["gate"], body["risk"], body["required_approvals"]) == (
        "plan",
        "low",
        1,
    )
    steps = body["args"]["steps"]
    assert [(s["step"], s["action"], s["risk"]) for s in steps] == [
        (1, "reserve_stock", "low"),
        (2, "charge_card", "low"),
        (3, "book_courier", "low"),
        (4, "notify_customer", "low"),
    ]
    assert steps[1]["affects"] == "charges 42.00 EUR to the customer's card"


def test_plan_approved_without_the_courier_and_a_lower_charge_runs_exactly_so(
    worker,
):
    _, client = tenant_with_client()
    request = waiting_plan(client, "ord-11")
    decided = decide(
        client,
        request,
        approved=True,
        note="The customer collects in store, with a 2.00 discount.",
        plan={
            "remove": [3],
            "args": {"2": {"order_id": "ORD-1", "amount": "40.00", "currency": "EUR"}},
        },
    )
    assert decided["status"] == "approved"
    assert wait_run(decided["resumed_run"]["run_id"]).status == "succeeded"
    values = state(client, "ord-11")
    assert values["done"] == ["reserve_stock", "charge_card", "notify_customer"]
    assert str(DemoCharge.objects.get().amount) == "40.00"
    assert not DemoCourierBooking.objects.exists()
    assert DemoStockReservation.objects.count() == 1
    assert DemoOutboxMessage.objects.count() == 1
    assert [edit.get("removed", False) for edit in decided["edits"]] == [False, True]


def test_an_edit_of_a_fixed_argument_is_refused_naming_it(worker):
    _, client = tenant_with_client()
    request = waiting_plan(client, "ord-12")
    response = client.post(
        f"/api/v1/approvals/{request.pk}/decision",
        {
            "approved": True,
            "note": "Another order.",
            "plan": {"args": {"3": {"order_id": "ORD-2", "parcels": 3}}},
        },
        format="json",
    )
    assert response.status_code == 400
    assert response.json()["fields"]["plan"]["args"]["3"]["order_id"] == [
        "order_id cannot be edited (editable: parcels)"
    ]
    request.refresh_from_db()
    assert request.status == "pending"


def test_a_denied_plan_runs_no_step(worker):
    _, client = tenant_with_client()
    request = waiting_plan(client, "ord-13")
    decided = decide(client, request, approved=False, note="Suspected fraud.")
    assert wait_run(decided["resumed_run"]["run_id"]).status == "succeeded"
    assert state(client, "ord-13")["outcome"] == "declined"
    assert not DemoStockReservation.objects.exists()
    assert not DemoCharge.objects.exists()
