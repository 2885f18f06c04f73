"""The demo agent: refund an order, with a human approval before money moves.

Input: {"customer_message": str, "order": {"id", "amount", "currency"?}}.

read_request -> plan_refund -> request_approval --approved--> execute_refund
                                                \\             -> notify_customer
                                                 \\--denied--> notify_denial
"""

from __future__ import annotations

import json
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.runtime import get_runtime
from langgraph.types import interrupt

from demo import downstream
from demo.agents.fake_model import RefundPlannerModel
from demo.agents.orders import OrderAmount
from runs.actions import GatedAction
from runs.tools import side_effect

# Arguments that are safe to show in clear in the audit trail.
SAFE_ARGS = frozenset({"order_id", "amount", "currency"})
# Risk by amount: what a reviewer needs to know at a glance.
HIGH_RISK_FROM = Decimal("500")
LOW_RISK_BELOW = Decimal("50")


class RefundState(TypedDict, total=False):
    customer_message: str
    order: dict[str, Any]
    messages: Annotated[list[AnyMessage], add_messages]
    plan: dict[str, Any]
    decision: dict[str, Any]
    payment: dict[str, Any]
    outcome: str


def risk_for(amount: str | Decimal) -> str:
    value = Decimal(amount)
    if value >= HIGH_RISK_FROM:
        return "high"
    return "low" if value < LOW_RISK_BELOW else "medium"


class RefundArgs(OrderAmount):
    """The arguments of `refund_order`, as a reviewer may approve them."""


def refund_risk(args: RefundArgs) -> str:
    return risk_for(args.amount)


REFUND_ORDER = GatedAction(
    name="refund_order",
    node="request_approval",
    args=RefundArgs,
    # A reviewer may refund less (or more: the risk then follows the amount);
    # the order and the currency are what the customer's case is about.
    editable={"amount"},
    risk=refund_risk,
)


def read_request(state: RefundState) -> RefundState:
    order = state.get("order") or {}
    missing = [name for name in ("id", "amount") if not order.get(name)]
    if missing or not state.get("customer_message"):
        raise ValueError(
            "refund input needs customer_message and order.id, order.amount; "
            f"missing: {', '.join(missing) or 'customer_message'}"
        )
    try:
        Decimal(str(order["amount"]))
    except InvalidOperation:
        raise ValueError("order.amount must be a decimal number") from None
    request = {"customer_message": state["customer_message"], "order": order}
    return {"messages": [HumanMessage(content=json.dumps(request, sort_keys=True))]}


def plan_refund(state: RefundState) -> RefundState:
    reply: AIMessage = RefundPlannerModel().invoke(state["messages"])
    call = reply.tool_calls[0]
    plan = {
        "action": call["name"],
        "args": call["args"],
        "reason": reply.additional_kwargs["reason"],
    }
    return {"messages": [reply], "plan": plan}


def request_approval(state: RefundState) -> RefundState:
    plan = state["plan"]
    args = plan["args"]
    amount, currency, order_id = args["amount"], args["currency"], args["order_id"]
    decision = interrupt(
        {
            "action": plan["action"],
            "args": args,
            "reason": plan["reason"],
            "affects": f"Refunds {amount} {currency} to the customer's original payment "
            f"method for order {order_id}; the order is marked refunded.",
            "if_denied": "No money moves; the customer is told the refund was declined, "
            "with the reviewer's note.",
            "risk": risk_for(amount),
            "gate": "action",
        }
    )
    return {"decision": decision}


def route_decision(state: RefundState) -> str:
    return "execute_refund" if state["decision"].get("approved") else "notify_denial"


def execute_refund(state: RefundState) -> RefundState:
    args = state["decision"].get("args") or state["plan"]["args"]
    tenant_id = get_runtime().context.tenant_id
    payment = side_effect(
        "payments.refund",
        args,
        lambda key: downstream.refund_payment(
            tenant_id=tenant_id,
            idempotency_key=key,
            order_id=args["order_id"],
            amount=str(args["amount"]),
            currency=args.get("currency", "EUR"),
        ),
        safe_keys=SAFE_ARGS,
    )
    return {"payment": payment}


def _notify(kind: str, body: str) -> dict:
    thread = get_runtime().context.thread_row()
    return side_effect(
        "outbox.send",
        {"kind": kind, "body": body},
        lambda key: downstream.send_customer_message(
            thread=thread, idempotency_key=key, kind=kind, body=body
        ),
        safe_keys=frozenset({"kind"}),
    )


def notify_customer(state: RefundState) -> RefundState:
    payment = state["payment"]
    _notify(
        "refund_issued",
        f"We refunded {payment['amount']} {payment['currency']} on order "
        f"{payment['order_id']} (reference {payment['payment_id']}).",
    )
    return {"outcome": "refunded"}


def notify_denial(state: RefundState) -> RefundState:
    note = state["decision"].get("note", "")
    _notify("refund_declined", f"We could not refund your order: {note}")
    return {"outcome": "denied"}


def build_graph() -> StateGraph:
    """Refunds an order after a human approves it; tells the customer either way."""
    graph = StateGraph(RefundState)
    graph.add_node("read_request", read_request)
    graph.add_node("plan_refund", plan_refund)
    graph.add_node("request_approval", request_approval)
    graph.add_node("execute_refund", execute_refund)
    graph.add_node("notify_customer", notify_customer)
    graph.add_node("notify_denial", notify_denial)
    graph.add_edge(START, "read_request")
    graph.add_edge("read_request", "plan_refund")
    graph.add_edge("plan_refund", "request_approval")
    graph.add_conditional_edges(
        "request_approval", route_decision, ["execute_refund", "notify_denial"]
    )
    graph.add_edge("execute_refund", "notify_customer")
    graph.add_edge("notify_customer", END)
    graph.add_edge("notify_denial", END)
    return graph


# Declarations the registry reads (see runs.registry.AgentSpec): metadata keys a
# client may store in clear on a refund thread, arguments that may appear in
# clear in the audit trail, and the actions it asks approval for.
build_graph.safe_metadata_keys = frozenset({"order_id", "channel"})
build_graph.safe_args = SAFE_ARGS
build_graph.actions = [REFUND_ORDER]
