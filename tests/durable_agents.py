"""Agents that exercise gatehouse.durable; tests register them in settings.

They report what they see through files in a directory the test passes in
(`dir`), and a step told to `hold` waits for a `release` file: a test can kill
the worker while a step is running, then let the step finish on the next one.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypedDict

from langgraph.func import entrypoint, task
from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

from gatehouse import durable


def gate_payload(action: str, **args: Any) -> dict:
    return {
        "action": action,
        "args": args,
        "reason": f"the test asks for {action}",
        "affects": "nothing outside the test",
        "if_denied": "the test sees the denial",
    }


def note(directory: str | None, name: str, line: Any = "x") -> int:
    """Append a line to `directory/name`; the number of lines so far."""
    if not directory:
        return 0
    path = Path(directory, name)
    with path.open("a") as file:
        file.write(json.dumps(line) + "\n")
    return len(path.read_text().splitlines())


def hold(directory: str, name: str) -> None:
    """Note that the step is running, then wait until the test releases it."""
    note(directory, name)
    release = Path(directory, "release")
    deadline = time.monotonic() + 120
    while not release.exists():
        if time.monotonic() > deadline:
            raise TimeoutError("the test never released the step")
        time.sleep(0.05)


# --- Functional API: an @entrypoint of @tasks ---------------------------------


@task
def count_first(directory: str | None) -> int:
    return note(directory, "first")


@task
def wait_for_release(directory: str) -> None:
    hold(directory, "second")


@task
def ask_in_task(payload: dict) -> dict:
    return interrupt(payload)


@entrypoint()
def tasks_workflow(inputs: dict) -> dict:
    """Runs a task, optionally a held one, then asks for approval in a task."""
    directory = inputs.get("dir")
    first = count_first(directory).result()
    if inputs.get("hold"):
        wait_for_release(directory).result()
    decision = ask_in_task(inputs.get("payload") or gate_payload("ship")).result()
    return {"first": first, "decision": decision}


# --- Replay-safe values in a StateGraph node ----------------------------------


class DeadlineState(TypedDict, total=False):
    dir: str
    hold: bool
    seen: dict
    decision: dict


def open_ticket(state: DeadlineState) -> DeadlineState:
    deadline = durable.now() + timedelta(hours=1)
    ticket = durable.uuid4()
    seen = {
        "deadline": deadline.isoformat(),
        "ticket": str(ticket),
        "draw": durable.random(),
        "seeded": durable.Random().randrange(10**12),
        "wall_clock": datetime.now(UTC).isoformat(),
    }
    note(state.get("dir"), "seen", seen)
    if state.get("hold"):
        hold(state["dir"], "held")
    decision = interrupt(gate_payload("open_ticket", **seen))
    return {"seen": seen, "decision": decision}


def deadline_graph() -> StateGraph:
    """Draws a deadline and a ticket before an approval and uses them after."""
    graph = StateGraph(DeadlineState)
    graph.add_node("open_ticket", open_ticket)
    graph.add_edge(START, "open_ticket")
    graph.add_edge("open_ticket", END)
    return graph


# --- Patches: the same agent before and after a deploy ------------------------


class ReviewState(TypedDict, total=False):
    checks: list
    decision: dict


def review_before(state: ReviewState) -> ReviewState:
    checks = ["amount"]
    decision = interrupt(gate_payload("ship", checks=checks))
    return {"checks": checks, "decision": decision}


def review_after(state: ReviewState) -> ReviewState:
    checks = ["amount"]
    if durable.patched("add-fraud-check"):
        checks.append("fraud")
    decision = interrupt(gate_payload("ship", checks=checks))
    return {"checks": checks, "decision": decision}


def _review_graph(review) -> StateGraph:
    graph = StateGraph(ReviewState)
    graph.add_node("review", review)
    graph.add_edge(START, "review")
    graph.add_edge("review", END)
    return graph


def review_graph() -> StateGraph:
    """Reviews an order before shipping it."""
    return _review_graph(review_before)


def review_graph_patched() -> StateGraph:
    """Reviews an order before shipping it, with a fraud check for new threads."""
    return _review_graph(review_after)


review_graph_patched.patches = frozenset({"add-fraud-check"})


# --- Checkpoint migration: an order agent, version 1 and version 2 ------------


class OrderV1(TypedDict, total=False):
    order: dict
    legacy_flag: bool
    decision: dict
    outcome: str


class OrderV2(TypedDict, total=False):
    order: dict
    amount_cents: int
    decision: dict
    outcome: str


def order_review(state: dict) -> dict:
    return {"decision": interrupt(gate_payload("ship", order_id=state["order"]["id"]))}


def order_escalate(state: dict) -> dict:
    return {"decision": interrupt(gate_payload("escalate"))}


def order_ship_v2(state: OrderV2) -> OrderV2:
    return {"outcome": f"shipped {state['amount_cents']} cents"}


def _order_graph(schema, ship, *, escalate: bool) -> StateGraph:
    graph = StateGraph(schema)
    graph.add_node("review", order_review)
    graph.add_node("ship", ship)
    graph.add_edge("review", "ship")
    graph.add_edge("ship", END)
    if escalate:
        graph.add_node("escalate", order_escalate)
        graph.add_edge("escalate", END)
        graph.add_conditional_edges(
            START,
            lambda state: "escalate" if state["order"].get("escalate") else "review",
            ["review", "escalate"],
        )
    else:
        graph.add_edge(START, "review")
    return graph


def order_graph_v1() -> StateGraph:
    """Ships an order once approved; escalates some to a manager."""
    return _order_graph(
        OrderV1, lambda state: {"outcome": "shipped (v1)"}, escalate=True
    )


def order_graph_v2() -> StateGraph:
    """Ships an order once approved, priced in cents."""
    return _order_graph(OrderV2, order_ship_v2, escalate=False)


def order_to_v2(state: dict) -> dict:
    """The migration from order@1 to order@2."""
    if state["order"].get("corrupt"):
        raise ValueError(f"order {state['order']['id']} cannot be priced")
    state.pop("legacy_flag", None)
    state["amount_cents"] = round(float(state["order"]["amount"]) * 100)
    return state


class SagaState(TypedDict, total=False):
    dir: str
    reserved: dict


def undo_unless_blocked(args: dict, result: dict, key: str) -> dict:
    """Undoes `reserve`; fails while the test's `blocked` file exists."""
    if Path(args["dir"], "blocked").exists():
        raise RuntimeError("the warehouse does not answer")
    note(args["dir"], "undone", key)
    return {"undone": result["n"]}


def reserve(state: SagaState) -> SagaState:
    args = {"dir": state["dir"]}
    reserved = durable.side_effect(
        "test.reserve",
        args,
        lambda key: {"n": note(state["dir"], "reserved", key)},
        compensate=undo_unless_blocked,
    )
    return {"reserved": reserved}


def fail(state: SagaState) -> SagaState:
    note(state["dir"], "failed")
    raise ValueError("the next step fails for good")


def saga_graph() -> StateGraph:
    """Reserves, then fails: the reservation is undone, if the undo works."""
    graph = StateGraph(SagaState)
    graph.add_node("reserve", reserve)
    graph.add_node("fail", fail)
    graph.add_edge(START, "reserve")
    graph.add_edge("reserve", "fail")
    graph.add_edge("fail", END)
    return graph


saga_graph.actions = []
