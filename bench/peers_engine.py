"""The peers of the side-by-side benchmark, each in a process of its own.

    python bench/peers_engine.py {dbos,floor} --database-url URL [--index N]

- `dbos`: DBOS Transact running the refund case as a workflow: a `plan` step,
  `set_event("approval")`, `recv("decision")`, a `pay` step, a `notify` step.
  The process is the application, as DBOS is deployed: it starts workflows
  itself, waits for the approval event (`get_event`), sends the decision
  (`send`) and awaits the result (`handle.get_result()`).
- `floor`: plain LangGraph with `PostgresSaver`: the same five nodes as the
  demo agent (read, plan, approval interrupt, pay, notify), invoked in this
  process with `durability="sync"` as Gatehouse's workers invoke graphs.

Both pay and notify through a stand-in provider that deduplicates on an
idempotency key in a table of the engine's own database (one transaction per
call), as Gatehouse's demo services do in its database.

The parent (bench/peers.py) speaks JSON lines: it writes one command per line
on stdin and reads one answer per line on stdout; the process prints
`{"ready": true}` once it can take commands. Commands:
`{"op": "latency", "runs": k, "first": i}` -> `{"samples": [...]}` and
`{"op": "throughput", "runs": n, "concurrency": c, "first": i}` -> the
window of `peers_common.throughput`. Anything libraries print goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Annotated, Any, TypedDict

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from langchain_core.messages import AnyMessage, HumanMessage  # noqa: E402
from langgraph.graph.message import add_messages  # noqa: E402
from peers_common import (  # noqa: E402
    APPROVAL,
    latency_samples,
    refund_request,
    throughput,
)

PROVIDER_TABLE = """
CREATE TABLE IF NOT EXISTS provider_call (
    idempotency_key text PRIMARY KEY,
    kind text NOT NULL,
    body jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
)
"""


class Provider:
    """The downstream systems (payments, outbox): a repeated key does nothing new."""

    def __init__(self, database_url: str, pool_size: int) -> None:
        from psycopg_pool import ConnectionPool

        self.pool = ConnectionPool(
            database_url,
            min_size=1,
            max_size=pool_size,
            kwargs={"autocommit": True},
            open=True,
        )
        with self.pool.connection() as conn:
            conn.execute(PROVIDER_TABLE)

    def call(self, key: str, kind: str, body: dict) -> dict:
        with self.pool.connection() as conn:
            row = conn.execute(
                "INSERT INTO provider_call (idempotency_key, kind, body) "
                "VALUES (%s, %s, %s) ON CONFLICT (idempotency_key) DO NOTHING "
                "RETURNING idempotency_key",
                [key, kind, json.dumps(body)],
            ).fetchone()
        return {"reference": key, "kind": kind, "new": row is not None}


def plan_refund(messages: list) -> Any:
    """The demo agent's planner model: the same work as its plan step."""
    from demo.agents.fake_model import RefundPlannerModel

    return RefundPlannerModel().invoke(messages)


def request_message(request: dict) -> HumanMessage:
    return HumanMessage(content=json.dumps(request, sort_keys=True))


def plan_of(reply) -> dict:
    call = reply.tool_calls[0]
    return {
        "action": call["name"],
        "args": call["args"],
        "reason": reply.additional_kwargs["reason"],
    }


def refund_body(payment_args: dict) -> dict:
    return {"order_id": payment_args["order_id"], "amount": payment_args["amount"]}


# --- DBOS ---------------------------------------------------------------------------


def dbos_flow(database_url: str, index: int, pool_size: int):
    from dbos import DBOS

    DBOS(
        config={
            "name": "gatehouse-bench-peers",
            "system_database_url": database_url,
            "application_version": "bench",
            "executor_id": f"bench-{index}",
            "sys_db_pool_size": pool_size,
            "log_level": "WARNING",
        }
    )
    provider = Provider(database_url, pool_size)

    @DBOS.step()
    def plan(request: dict) -> dict:
        return plan_of(plan_refund([request_message(request)]))

    @DBOS.step()
    def pay(key: str, args: dict) -> dict:
        return provider.call(key, "payments.refund", refund_body(args))

    @DBOS.step()
    def notify(key: str, kind: str, body: str) -> dict:
        return provider.call(key, "outbox.send", {"kind": kind, "body": body})

    @DBOS.workflow()
    def refund(request: dict) -> str:
        proposal = plan(request)
        DBOS.set_event("approval", proposal)
        decision = DBOS.recv("decision", timeout_seconds=600)
        workflow_id = DBOS.workflow_id
        if not decision or not decision.get("approved"):
            notify(f"{workflow_id}:notify", "refund_declined", "declined")
            return "denied"
        payment = pay(f"{workflow_id}:pay", proposal["args"])
        notify(f"{workflow_id}:notify", "refund_issued", payment["reference"])
        return "refunded"

    DBOS.launch()

    def flow(case: int) -> dict:
        started = time.perf_counter()
        handle = DBOS.start_workflow(refund, refund_request(case))
        if DBOS.get_event(handle.workflow_id, "approval", timeout_seconds=60) is None:
            raise TimeoutError(f"workflow {handle.workflow_id} never asked")
        waiting = time.perf_counter()
        DBOS.send(handle.workflow_id, APPROVAL, "decision")
        sent = time.perf_counter()
        if handle.get_result() != "refunded":
            raise RuntimeError(f"workflow {handle.workflow_id} did not refund")
        done = time.perf_counter()
        return {
            "start_to_waiting": waiting - started,
            "decision_call": sent - waiting,
            "decision_to_succeeded": done - waiting,
        }

    return flow


# --- the LangGraph floor ---------------------------------------------------------------


class FloorState(TypedDict, total=False):
    request: dict
    messages: Annotated[list[AnyMessage], add_messages]
    plan: dict
    decision: dict
    payment: dict
    outcome: str


def floor_flow(database_url: str, index: int, pool_size: int):
    from langgraph.checkpoint.postgres import PostgresSaver
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import Command, interrupt
    from psycopg.rows import dict_row
    from psycopg_pool import ConnectionPool

    provider = Provider(database_url, pool_size)
    pool = ConnectionPool(
        database_url,
        min_size=1,
        max_size=pool_size,
        kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
        open=True,
    )
    saver = PostgresSaver(pool)
    saver.setup()

    def step_key(config, node: str) -> str:
        return f"{config['configurable']['thread_id']}:{node}"

    def read_request(state: FloorState) -> FloorState:
        return {"messages": [request_message(state["request"])]}

    def plan_step(state: FloorState) -> FloorState:
        reply = plan_refund(state["messages"])
        return {"messages": [reply], "plan": plan_of(reply)}

    def request_approval(state: FloorState) -> FloorState:
        return {"decision": interrupt(state["plan"])}

    def execute_refund(state: FloorState, config) -> FloorState:
        key = step_key(config, "pay")
        args = state["plan"]["args"]
        return {"payment": provider.call(key, "payments.refund", refund_body(args))}

    def notify_customer(state: FloorState, config) -> FloorState:
        body = {"kind": "refund_issued", "body": state["payment"]["reference"]}
        provider.call(step_key(config, "notify"), "outbox.send", body)
        return {"outcome": "refunded"}

    graph = StateGraph(FloorState)
    for name, node in (
        ("read_request", read_request),
        ("plan_refund", plan_step),
        ("request_approval", request_approval),
        ("execute_refund", execute_refund),
        ("notify_customer", notify_customer),
    ):
        graph.add_node(name, node)
    graph.add_edge(START, "read_request")
    graph.add_edge("read_request", "plan_refund")
    graph.add_edge("plan_refund", "request_approval")
    graph.add_edge("request_approval", "execute_refund")
    graph.add_edge("execute_refund", "notify_customer")
    graph.add_edge("notify_customer", END)
    compiled = graph.compile(checkpointer=saver)

    def flow(case: int) -> dict:
        config = {"configurable": {"thread_id": f"floor-{index}-{case}"}}
        started = time.perf_counter()
        first = compiled.invoke(
            {"request": refund_request(case)}, config, durability="sync"
        )
        if "__interrupt__" not in first:
            raise RuntimeError("the floor's graph did not stop for approval")
        waiting = time.perf_counter()
        final = compiled.invoke(Command(resume=APPROVAL), config, durability="sync")
        if final.get("outcome") != "refunded":
            raise RuntimeError("the floor's graph did not refund")
        done = time.perf_counter()
        return {
            "start_to_waiting": waiting - started,
            "decision_call": None,
            "decision_to_succeeded": done - waiting,
        }

    return flow


ENGINES = {"dbos": dbos_flow, "floor": floor_flow}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("engine", choices=sorted(ENGINES))
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--index", type=int, default=0, help="this process's number")
    parser.add_argument(
        "--pool-size", type=int, default=30, help="database connections at most"
    )
    args = parser.parse_args()
    # Answers go to the real stdout; whatever a library prints goes to stderr.
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())

    flow = ENGINES[args.engine](args.database_url, args.index, args.pool_size)
    answers.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        command = json.loads(line)
        if command["op"] == "latency":
            answer = {
                "samples": latency_samples(flow, command["runs"], command["first"])
            }
        elif command["op"] == "throughput":
            answer = throughput(
                flow, command["runs"], command["concurrency"], command["first"]
            )
        else:
            answer = {"error": f"unknown op {command['op']!r}"}
        answers.write(json.dumps(answer) + "\n")


if __name__ == "__main__":
    main()
