"""The bundled `fulfilment` agent end to end over REST, on a real worker."""

import pytest

from approvals.models import ApprovalRequest
from demo.models import (
    DemoCharge,
    DemoCourierBooking,
    DemoOutboxMessage,
    DemoStockReservation,
)
from tests.durable.helpers import plan_approved, start, state, wait_run
from tests.factories import api_client, make_api_key, make_member, tenant_with_client

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


def order(**extra) -> dict:
    return {
        "order": {
            "id": "ORD-1",
            "items": [{"sku": "MUG-1", "qty": 2}, {"sku": "TEA-9", "qty": 1}],
            "amount": "42.00",
            "currency": "EUR",
            **extra,
        }
    }


def test_an_order_is_reserved_charged_booked_and_announced_in_order(worker):
    _, client = tenant_with_client()
    started = start(client, "fulfilment", "ord-1", order())
    run = wait_run(plan_approved(client, "ord-1", started))
    assert run.status == "succeeded"
    values = state(client, "ord-1")
    assert values["done"] == [
        "reserve_stock",
        "charge_card",
        "book_courier",
        "notify_customer",
    ]
    assert values["outcome"] == "dispatched"
    assert DemoStockReservation.objects.get().lines == [
        {"sku": "MUG-1", "qty": 2},
        {"sku": "TEA-9", "qty": 1},
    ]
    assert str(DemoCharge.objects.get().amount) == "42.00"
    assert DemoCourierBooking.objects.get().parcels == 3
    assert DemoOutboxMessage.objects.get().kind == "order_dispatched"
    assert list(ApprovalRequest.objects.values_list("gate", "status")) == [
        ("plan", "approved")
    ]


def test_a_high_charge_stops_at_its_own_gate(worker):
    tenant, client = tenant_with_client()
    assert wait_run(start(client, "fulfilment", "ord-2", order(amount="900.00")))
    alice, bob = (
        api_client(
            make_api_key(tenant, ["approvals"], user=make_member(tenant).user)[1]
        )
        for _ in range(2)
    )
    plan = ApprovalRequest.objects.get(gate="plan")
    plan_url = f"/api/v1/approvals/{plan.pk}/decision"
    assert alice.post(plan_url, {"approved": True}, format="json").status_code == 200
    resumed = bob.post(plan_url, {"approved": True}, format="json").json()
    run = wait_run(resumed["resumed_run"]["run_id"])
    assert run.status == "interrupted"
    request = ApprovalRequest.objects.get(gate="action")
    assert (request.action, request.risk, request.required_approvals) == (
        "charge_card",
        "high",
        2,
    )
    assert DemoStockReservation.objects.count() == 1
    assert not DemoCharge.objects.exists()
    url = f"/api/v1/approvals/{request.pk}/decision"
    assert alice.post(url, {"approved": True}, format="json").status_code == 200
    resumed = bob.post(url, {"approved": True}, format="json").json()
    assert wait_run(resumed["resumed_run"]["run_id"]).status == "succeeded"
    assert str(DemoCharge.objects.get().amount) == "900.00"
    assert state(client, "ord-2")["outcome"] == "dispatched"


def test_the_courier_refusing_the_order_fails_the_run(worker):
    _, client = tenant_with_client()
    started = start(client, "fulfilment", "ord-3", order(courier_refuses=True))
    run_id = plan_approved(client, "ord-3", started)
    assert wait_run(run_id).status == "failed"
    error = client.get(f"/api/v1/threads/ord-3/runs/{run_id}").json()["error"]
    assert "refused order ORD-1" in error
    assert not DemoCourierBooking.objects.exists()


def test_an_incomplete_order_fails_naming_what_is_missing(worker):
    _, client = tenant_with_client()
    run_id = start(client, "fulfilment", "ord-4", {"order": {"id": "ORD-4"}})
    assert wait_run(run_id).status == "failed"
    error = client.get(f"/api/v1/threads/ord-4/runs/{run_id}").json()["error"]
    assert "missing: items, amount" in error
