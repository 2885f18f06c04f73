"""The second demo agent: fulfil an order, step by step, as a saga.

Input: {"order": {"id", "items": [{"sku", "qty"}], "amount", "currency"?,
"courier_outages"?, "courier_refuses"?}}. The last two are the demo courier's
knobs: it is down for that many requests, or it refuses the order.

plan_fulfilment -> review_plan -> reserve_stock -> charge_card -> book_courier
                                                                -> notify_customer

`plan_fulfilment` writes the ordered steps (`steps`: [{"action", "args"}]);
`review_plan` asks a person to approve the whole plan first (a `gate: "plan"`
request, approvals.plans), who may remove steps or edit their arguments, and
replaces `steps` with the plan as approved (none if it was denied). Each step
node carries out its own step and hands over to the next step of the plan
(`next_step`), so a step taken out of the plan is skipped. A charge of
HIGH_RISK_FROM or more stops at its own approval gate first, plan or not.

It is a saga: reserving, charging and booking each name what undoes them
(`compensate=`), so when a later step fails for good (the courier refuses the
order, or stays down past its retries) or a reviewer denies the charge, the run
releases, refunds and cancels what it did, newest first (runs.compensation).
"""

from __future__ import annotations

import operator
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any, TypedDict

import pydantic
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import get_runtime
from langgraph.types import interrupt

from demo import downstream
from demo.agents.orders import OrderAmount, OrderArgs
from gatehouse.durable import RetryPolicy, side_effect
from runs.actions import GatedAction

STEPS = ("reserve_stock", "charge_card", "book_courier", "notify_customer")
# Arguments that are safe to show in clear in the audit trail.
SAFE_ARGS = frozenset({"order_id", "amount", "currency", "parcels", "kind"})
HIGH_RISK_FROM = Decimal("500")
# A courier that does not answer is tried again with the same key; one that
# refuses the order is not.
COURIER_RETRY = RetryPolicy(
    attempts=3, backoff=0.5, retry_on=(downstream.CourierUnavailable,)
)


class ChargeDenied(Exception):
    """A reviewer denied the charge: the order is cancelled and undone."""


class FulfilmentState(TypedDict, total=False):
    order: dict[str, Any]
    # The plan: [{"action": one of STEPS, "args": {...}}], in order.
    steps: list[dict[str, Any]]
    # The actions carried out so far, in order.
    done: Annotated[list[str], operator.add]
    reservation: dict[str, Any]
    charge: dict[str, Any]
    booking: dict[str, Any]
    decision: dict[str, Any]
    # The plan's decision: the plan as approved is its args.steps.
    plan_review: dict[str, Any]
    outcome: str


class ChargeArgs(OrderAmount):
    """The arguments of `charge_card`, as a reviewer may approve them."""


def charge_risk(args: ChargeArgs) -> str:
    return "high" if args.amount >= HIGH_RISK_FROM else "low"


class Line(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")

    sku: str = pydantic.Field(min_length=1, max_length=64)
    qty: int = pydantic.Field(gt=0, le=1000)


class ReserveArgs(OrderArgs):
    lines: list[Line] = pydantic.Field(min_length=1, max_length=100)


class CourierArgs(OrderArgs):
    parcels: int = pydantic.Field(gt=0, le=1000)


class NotifyArgs(OrderArgs):
    kind: str = pydantic.Field(pattern=r"^[a-z_]{1,40}$")


def low_risk(args: pydantic.BaseModel) -> str:
    return "low"


# The steps only a plan reviews (no node: they never stop on their own). A
# reviewer may send fewer parcels (the customer collects some), nothing else.
PLAN_STEPS = [
    GatedAction(name="reserve_stock", args=ReserveArgs, risk=low_risk),
    GatedAction(
        name="book_courier", args=CourierArgs, editable={"parcels"}, risk=low_risk
    ),
    GatedAction(name="notify_customer", args=NotifyArgs, risk=low_risk),
]
# The plan itself; its steps are judged by the actions' declarations.
FULFIL_ORDER = GatedAction(name="fulfil_order", node="review_plan")

CHARGE_CARD = GatedAction(
    name="charge_card",
    node="charge_card",
    args=ChargeArgs,
    # A reviewer may charge less (a goodwill discount), never another order.
    editable={"amount"},
    risk=charge_risk,
)


def plan_fulfilment(state: FulfilmentState) -> FulfilmentState:
    order = state.get("order") or {}
    missing = [name for name in ("id", "items", "amount") if not order.get(name)]
    if missing:
        raise ValueError(
            f"fulfilment input needs order.id, order.items, order.amount; "
            f"missing: {', '.join(missing)}"
        )
    try:
        amount = Decimal(str(order["amount"]))
    except InvalidOperation:
        raise ValueError("order.amount must be a decimal number") from None
    order_id = str(order["id"])
    lines = [{"sku": str(i["sku"]), "qty": int(i["qty"])} for i in order["items"]]
    steps = [
        {"action": "reserve_stock", "args": {"order_id": order_id, "lines": lines}},
        {
            "action": "charge_card",
            "args": {
                "order_id": order_id,
                "amount": f"{amount:.2f}",
                "currency": order.get("currency", "EUR"),
            },
        },
        {
            "action": "book_courier",
            "args": {
                "order_id": order_id,
                "parcels": sum(line["qty"] for line in lines),
            },
        },
        {
            "action": "notify_customer",
            "args": {"order_id": order_id, "kind": "order_dispatched"},
        },
    ]
    return {"steps": steps}


def _explained(step: dict[str, Any]) -> dict[str, str]:
    """What a reviewer of the plan reads about one step."""
    action, args = step["action"], step["args"]
    if action == "reserve_stock":
        held = ", ".join(f"{line['qty']} x {line['sku']}" for line in args["lines"])
        return {
            "reason": "the items must be held before the card is charged",
            "affects": f"holds {held} in the warehouse for order {args['order_id']}",
            "if_denied": "nothing is held, charged, booked or sent",
        }
    if action == "charge_card":
        return {
            "reason": "the order is paid by card when it is dispatched",
            "affects": f"charges {args['amount']} {args['currency']} to the "
            "customer's card",
            "if_denied": "nothing is charged; the reserved stock is released",
        }
    if action == "book_courier":
        return {
            "reason": "the parcels need a courier",
            "affects": f"books a courier for {args['parcels']} parcel(s)",
            "if_denied": "no courier comes: the customer collects the order",
        }
    return {
        "reason": "the customer is told when the order leaves",
        "affects": "sends the customer one message",
        "if_denied": "the customer is not told",
    }


def review_plan(state: FulfilmentState) -> FulfilmentState:
    steps = state["steps"]
    order_id = state["order"]["id"]
    decision = interrupt(
        {
            "action": "fulfil_order",
            "gate": "plan",
            "args": {"steps": [{**step, **_explained(step)} for step in steps]},
            "reason": f"order {order_id} is paid for and in stock",
            "affects": "the warehouse's stock, the customer's card, a courier and "
            "the customer's inbox, in that order",
            "if_denied": "no step runs: nothing is held, charged, booked or sent; "
            "the order stays open for a person",
        }
    )
    if not decision.get("approved"):
        return {"steps": [], "plan_review": decision, "outcome": "declined"}
    approved = [
        {"action": step["action"], "args": step["args"]}
        for step in decision["args"]["steps"]
    ]
    return {"steps": approved, "plan_review": decision}


def _args(state: FulfilmentState, action: str) -> dict[str, Any]:
    return next(step["args"] for step in state["steps"] if step["action"] == action)


def next_step(state: FulfilmentState) -> str:
    """The first step of the plan not carried out yet; END when none is left."""
    done = set(state.get("done") or ())
    for step in state.get("steps") or ():
        if step["action"] not in done:
            return step["action"]
    return END


# What undoes each step; called with the step's arguments, its result and the
# undoing's own idempotency key.
def release_stock(args: dict, reservation: dict, key: str) -> dict:
    return downstream.release_stock(reservation_id=reservation["reservation_id"])


def refund_charge(args: dict, charge: dict, key: str) -> dict:
    return downstream.refund_charge(charge_id=charge["charge_id"])


def cancel_courier(args: dict, booking: dict, key: str) -> dict:
    return downstream.cancel_courier(booking_id=booking["booking_id"])


def reserve_stock(state: FulfilmentState) -> FulfilmentState:
    args = _args(state, "reserve_stock")
    tenant_id = get_runtime().context.tenant_id
    reservation = side_effect(
        "warehouse.reserve",
        args,
        lambda key: downstream.reserve_stock(
            tenant_id=tenant_id,
            idempotency_key=key,
            order_id=args["order_id"],
            lines=args["lines"],
        ),
        safe_keys=SAFE_ARGS,
        compensate=release_stock,
    )
    return {"reservation": reservation, "done": ["reserve_stock"]}


def charge_card(state: FulfilmentState) -> FulfilmentState:
    args = _args(state, "charge_card")
    update: FulfilmentState = {"done": ["charge_card"]}
    if charge_risk(ChargeArgs(**args)) == "high":
        decision = interrupt(
            {
                "action": "charge_card",
                "args": args,
                "reason": "the order is above the amount charged without review",
                "affects": f"charges {args['amount']} {args['currency']} to the "
                f"customer's card for order {args['order_id']}",
                "if_denied": "nothing is charged; the reserved stock is released "
                "and the order is cancelled",
                "risk": "high",
            }
        )
        update["decision"] = decision
        if not decision.get("approved"):
            raise ChargeDenied(
                f"the charge for order {args['order_id']} was denied by "
                f"{decision.get('reviewer')}"
            )
        args = decision.get("args") or args
    tenant_id = get_runtime().context.tenant_id
    update["charge"] = side_effect(
        "cards.charge",
        args,
        lambda key: downstream.charge_card(
            tenant_id=tenant_id,
            idempotency_key=key,
            order_id=args["order_id"],
            amount=str(args["amount"]),
            currency=args["currency"],
        ),
        safe_keys=SAFE_ARGS,
        compensate=refund_charge,
    )
    return update


def book_courier(state: FulfilmentState) -> FulfilmentState:
    args = _args(state, "book_courier")
    order = state["order"]
    tenant_id = get_runtime().context.tenant_id
    booking = side_effect(
        "courier.book",
        args,
        lambda key: downstream.book_courier(
            tenant_id=tenant_id,
            idempotency_key=key,
            order_id=args["order_id"],
            parcels=args["parcels"],
            outages=int(order.get("courier_outages", 0)),
            refuse=bool(order.get("courier_refuses", False)),
        ),
        safe_keys=SAFE_ARGS,
        retry=COURIER_RETRY,
        timeout=10,
        compensate=cancel_courier,
    )
    return {"booking": booking, "done": ["book_courier"]}


def notify_customer(state: FulfilmentState) -> FulfilmentState:
    args = _args(state, "notify_customer")
    thread = get_runtime().context.thread_row()
    body = f"Your order {args['order_id']} is on its way."
    side_effect(
        "outbox.send",
        {"kind": args["kind"], "body": body},
        lambda key: downstream.send_customer_message(
            thread=thread, idempotency_key=key, kind=args["kind"], body=body
        ),
        safe_keys=SAFE_ARGS,
    )
    return {"outcome": "dispatched", "done": ["notify_customer"]}


def build_graph() -> StateGraph:
    """Fulfils an order: reserves stock, charges the card, books the courier,
    tells the customer; undoes what it did if a step fails for good."""
    graph = StateGraph(FulfilmentState)
    graph.add_node("plan_fulfilment", plan_fulfilment)
    graph.add_node("review_plan", review_plan)
    for name, node in zip(
        STEPS, (reserve_stock, charge_card, book_courier, notify_customer), strict=True
    ):
        graph.add_node(name, node)
        graph.add_conditional_edges(name, next_step, [*STEPS, END])
    graph.add_edge(START, "plan_fulfilment")
    graph.add_edge("plan_fulfilment", "review_plan")
    graph.add_conditional_edges("review_plan", next_step, [*STEPS, END])
    return graph


# Declarations the registry reads (see runs.registry.AgentSpec).
build_graph.safe_metadata_keys = frozenset({"order_id", "channel"})
build_graph.safe_args = SAFE_ARGS
build_graph.actions = [FULFIL_ORDER, CHARGE_CARD, *PLAN_STEPS]
