"""Plan gates for the tests: a thread of the docs' plan-review agent
(`doc-plan`, docs/writing-agents.md) waiting on its plan, without running it,
and the same on the real worker."""

from __future__ import annotations

import itertools

from approvals.models import ApprovalRequest
from tests.approvals.helpers import opened_request
from tests.durable.helpers import start, wait_run

_cases = itertools.count(1)
NOTE = "The customer collects in store: no email, and one item only."


def order(amount: str = "80.00", quantity: int = 2, order_id: str = "O-1") -> dict:
    return {"id": order_id, "sku": "BLENDER-1", "quantity": quantity, "amount": amount}


def plan_payload(order: dict) -> dict:
    """What the plan agent's review_plan node asks (its interrupt payload)."""
    step = {"reason": "why", "affects": "what", "if_denied": "nothing"}
    return {
        "action": "fulfil_order",
        "gate": "plan",
        "args": {
            "steps": [
                {
                    "action": "reserve_stock",
                    "args": {"sku": order["sku"], "quantity": order["quantity"]},
                    **step,
                },
                {
                    "action": "charge_card",
                    "args": {"order_id": order["id"], "amount": order["amount"]},
                    **step,
                },
                {
                    "action": "notify_customer",
                    "args": {"order_id": order["id"], "channel": "email"},
                    **step,
                },
            ]
        },
        "reason": "a new order to fulfil",
        "affects": "the stock, the customer's card and their inbox",
        "if_denied": "nothing happens",
    }


def waiting_plan(tenant, payload: dict | None = None, **order_fields):
    """A doc-plan thread stopped at its plan gate (not executed): its request."""
    return opened_request(
        tenant,
        agent="doc-plan",
        thread_id=f"order-{next(_cases)}",
        node="review_plan",
        payload=payload or plan_payload(order(**order_fields)),
    )


def running_plan(client, thread_id: str, **order_fields) -> ApprovalRequest:
    """A doc-plan thread run on the worker up to its plan gate: its request."""
    run_id = start(client, "doc-plan", thread_id, {"order": order(**order_fields)})
    assert wait_run(run_id).status == "interrupted"
    return ApprovalRequest.objects.get(thread__thread_id=thread_id, gate="plan")


def decide(client, approval, **body):
    return client.post(
        f"/api/v1/approvals/{approval.pk}/decision",
        {"approved": True, **body},
        format="json",
    )
