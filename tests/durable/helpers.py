"""Starting agents over REST and waiting for their runs, for the durable tests."""

from __future__ import annotations

from typing import Any

from approvals.models import ApprovalRequest
from runs.models import Run
from tests.workers import wait_for


def start(client, agent: str, thread_id: str, input: dict[str, Any]) -> str:
    """Create the thread and start a run on it; the run's id."""
    created = client.post(
        "/api/v1/threads", {"thread_id": thread_id, "agent": agent}, format="json"
    )
    assert created.status_code == 201, created.content
    started = client.post(
        f"/api/v1/threads/{thread_id}/runs", {"input": input}, format="json"
    )
    assert started.status_code == 202, started.content
    return started.json()["run_id"]


def wait_run(run_id: str, *statuses: str, timeout: float = 90) -> Run:
    """Wait until the run reaches one of `statuses` (any end, if none given)."""
    ends = statuses or ("interrupted", "succeeded", "failed", "cancelled")
    wait_for(
        lambda: Run.objects.filter(pk=run_id, status__in=ends).exists(),
        timeout=timeout,
        what=f"run {run_id} to be {' or '.join(ends)}",
    )
    return Run.objects.get(pk=run_id)


def decide(client, thread_id: str, **decision: Any) -> str:
    """Decide the thread's one pending approval; the resume run's id."""
    request = ApprovalRequest.objects.get(
        thread__thread_id=thread_id, status=ApprovalRequest.Status.PENDING
    )
    response = client.post(
        f"/api/v1/approvals/{request.pk}/decision",
        {"approved": True, **decision},
        format="json",
    )
    assert response.status_code == 200, response.content
    return response.json()["resumed_run"]["run_id"]


def plan_approved(client, thread_id: str, run_id: str) -> str:
    """The run stopped at its plan gate first (the bundled `fulfilment`
    agent asks approval for its whole plan): approve the plan as it is; the
    id of the run that carries it out."""
    assert wait_run(run_id).status == "interrupted"
    return decide(client, thread_id)


def state(client, thread_id: str) -> dict:
    response = client.get(f"/api/v1/threads/{thread_id}/state")
    assert response.status_code == 200, response.content
    return response.json()["values"]


class InProcess:
    """A one-node graph run in this process on a new thread with Gatehouse's
    saver and run context, as the worker would run it: for what can be shown
    without a worker."""

    def __init__(self, node) -> None:
        from langgraph.graph import END, START, StateGraph

        from audit.services import Actor
        from runs.checkpointer import DjangoSaver
        from runs.services import thread_create
        from tests.factories import make_tenant

        tenant = make_tenant()
        self.thread = thread_create(
            tenant=tenant, agent="echo", actor=Actor.system("tests")
        )
        builder = StateGraph(dict)
        builder.add_node("node", node)
        builder.add_edge(START, "node")
        builder.add_edge("node", END)
        self.graph = builder.compile(checkpointer=DjangoSaver(tenant=tenant))

    def invoke(self, value, *, run_id: str = "run", **context):
        """Invoke the graph as run `run_id` (a resume is another run)."""
        from runs.context import RunContext

        return self.graph.invoke(
            value,
            {"configurable": {"thread_id": self.thread.thread_id}},
            context=RunContext(
                tenant_id=self.thread.tenant_id,
                thread_pk=self.thread.pk,
                run_id=run_id,
                **context,
            ),
        )
