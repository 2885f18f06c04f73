"""Setup for the reviewer's desk tests: requests waiting on a human.

`waiting_request` makes what a refund run leaves behind when it stops for an
approval (an interrupted thread and run, and the request opened through the
approvals service, payload encrypted), without executing the graph; tests
that need the thread's real checkpoints run the agent on the worker instead.
"""

from __future__ import annotations

import itertools
import uuid

from django.test import Client
from langgraph.types import Interrupt

from approvals.models import ApprovalRequest
from approvals.services import approval_requests_open
from audit.services import Actor
from demo.agents.refund import risk_for
from runs.models import Run, Thread
from runs.services import thread_create

_cases = itertools.count(1)
TESTS = Actor.system("tests")


def refund_payload(order_id: str, amount: str, currency: str = "EUR") -> dict:
    return {
        "action": "refund_order",
        "args": {"order_id": order_id, "amount": amount, "currency": currency},
        "reason": f"The customer reports order {order_id} arrived damaged.",
        "affects": f"Refunds {amount} {currency} for order {order_id}.",
        "if_denied": "No money moves; the customer is told why.",
        "risk": risk_for(amount),
        "gate": "action",
    }


def opened_request(
    tenant, *, agent: str, thread_id: str, node: str, payload: dict
) -> ApprovalRequest:
    """A thread of `agent`@1 whose run stopped at `node` with `payload`, and
    the request the approvals service opened for it."""
    thread = thread_create(tenant=tenant, agent=agent, actor=TESTS, thread_id=thread_id)
    thread.agent_version = "1"
    thread.status = Thread.Status.INTERRUPTED
    thread.save(update_fields=["agent_version", "status", "updated_at"])
    run = Run.objects.create(
        tenant=tenant,
        thread=thread,
        kind=Run.Kind.START,
        status=Run.Status.INTERRUPTED,
        agent_version="1",
        next_nodes=[node],
    )
    (request,) = approval_requests_open(
        run=run, interrupts=[Interrupt(value=payload, id=uuid.uuid4().hex)]
    )
    return ApprovalRequest.objects.select_related("thread", "tenant").get(pk=request.pk)


def waiting_request(
    tenant, *, amount: str = "40.00", thread_id: str | None = None
) -> ApprovalRequest:
    number = next(_cases)
    return opened_request(
        tenant,
        agent="refund",
        thread_id=thread_id or f"case-{number}",
        node="request_approval",
        payload=refund_payload(f"A-{1000 + number}", amount),
    )


def logged_in(user, **kwargs) -> Client:
    client = Client(**kwargs)
    client.force_login(user)
    return client


QUEUE = "/admin/approvals/approvalrequest/"


def listed(client, query: str = "") -> list[str]:
    """The thread ids of the admin queue's rows, in order."""
    response = client.get(QUEUE + query)
    assert response.status_code == 200
    return [row.thread.thread_id for row in response.context["cl"].result_list]


def card_url(approval) -> str:
    return f"/admin/approvals/approvalrequest/{approval.pk}/change/"


def decide_url(approval) -> str:
    return f"/admin/approvals/approvalrequest/{approval.pk}/decide/"


def open_card(client, approval):
    """GET the request page; returns (response, the opening id in its forms)."""
    response = client.get(card_url(approval))
    assert response.status_code == 200, response.content[:2000]
    opening = response.context["opening"]
    return response, (str(opening.pk) if opening else None)


def refund_input(order_id: str = "A-1001", amount: str = "40.00") -> dict:
    return {
        "customer_message": "My blender arrived damaged, please refund me.",
        "order": {"id": order_id, "amount": amount, "currency": "EUR"},
    }


def start_refund(client, thread_id: str, **order) -> str:
    """Create a refund thread and start a run over the API; the run's id."""
    created = client.post(
        "/api/v1/threads", {"thread_id": thread_id, "agent": "refund"}, format="json"
    )
    assert created.status_code == 201, created.content
    started = client.post(
        f"/api/v1/threads/{thread_id}/runs",
        {"input": refund_input(**order)},
        format="json",
    )
    assert started.status_code == 202, started.content
    return started.json()["run_id"]


def wait_run(client, thread_id: str, run_id: str, status: str, timeout: float = 30):
    """Poll the run over the API until it has `status`; the last body seen is
    in the failure message."""
    from tests.workers import wait_for

    url = f"/api/v1/threads/{thread_id}/runs/{run_id}"
    seen = {}

    def reached() -> bool:
        seen["body"] = client.get(url).json()
        return seen["body"].get("status") == status

    try:
        wait_for(reached, timeout=timeout, what=f"run {run_id} to be {status}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last seen: {seen.get('body')}") from None
