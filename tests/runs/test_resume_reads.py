"""A resume reads the thread's runs and its latest checkpoint (the gate's
check) in one round trip (runs.checkpointer's latest_after: a pipeline), and
the gate sees the same pending interrupts as a read of its own.

The test is the worker: it executes the runs in this process
(runs.execution.execute)."""

import pytest
from django.db import connection
from langgraph.constants import CONFIG_KEY_CHECKPOINTER
from psycopg import pq

from approvals.services import lifecycle
from runs import execution, gates
from runs.graphs import compile_for, thread_config
from runs.models import Run, Thread
from tests.factories import REFUND_INPUT, tenant_with_client

pytestmark = pytest.mark.django_db(transaction=True)


class _Traced:
    """The frontend's Sync messages on this thread's connection (each one a
    round trip's end) between start() and stop(), by libpq's trace."""

    def __init__(self, path) -> None:
        self.path = path
        self.file = None

    def start(self) -> None:
        self.file = open(self.path, "w")  # noqa: SIM115
        pgconn = connection.connection.pgconn
        pgconn.trace(self.file.fileno())
        pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)

    def stop(self) -> None:
        if self.file is None:
            return
        connection.connection.pgconn.untrace()
        self.file.close()
        self.file = None

    def messages(self, kind: str) -> list[str]:
        with open(self.path) as lines:
            return [
                line for line in lines if line.split("\t")[:1] == ["F"] and kind in line
            ]


def _gated(client, dispatched, thread_id: str) -> str:
    client.post(
        "/api/v1/threads", {"thread_id": thread_id, "agent": "refund"}, format="json"
    )
    client.post(
        f"/api/v1/threads/{thread_id}/runs", {"input": REFUND_INPUT}, format="json"
    )
    execution.execute(dispatched.pop())
    assert Thread.objects.get(thread_id=thread_id).status == "interrupted"
    return client.get(f"/api/v1/threads/{thread_id}").json()["pending_approvals"][0]


def test_a_decisions_resume_reads_the_runs_and_the_checkpoint_in_one_round_trip(
    dispatched, monkeypatch, tmp_path
):
    _, client = tenant_with_client()
    approval_id = _gated(client, dispatched, "t-1")
    traced = _Traced(tmp_path / "trace")
    resume, check = lifecycle.run_resume_locked, gates.check_resume
    seen = []

    def resuming(**kwargs):
        traced.start()
        try:
            return resume(**kwargs)
        finally:
            traced.stop()

    def checked(*, thread, graph, saver=None, **kwargs):
        if saver is not None:
            kwargs["saver"] = saver
        check(thread=thread, graph=graph, **kwargs)
        traced.stop()  # counted: from the resume's start to the gate's answer
        # The gate read the checkpoint read with the runs: the same pending
        # interrupts as a read of the database of its own.
        config = thread_config(thread)
        config["configurable"][CONFIG_KEY_CHECKPOINTER] = saver or graph.checkpointer
        seen.append(
            (
                saver is not None and saver is not graph.checkpointer,
                graph.get_state(config).interrupts,
                compile_for(thread).get_state(thread_config(thread)).interrupts,
            )
        )

    monkeypatch.setattr(lifecycle, "run_resume_locked", resuming)
    monkeypatch.setattr(gates, "check_resume", checked)
    response = client.post(
        f"/api/v1/approvals/{approval_id}/decision",
        {"approved": True, "reviewer": "rita"},
        format="json",
    )
    assert response.status_code == 200, response.json()
    assert response.json()["resumed_run"]["status"] == "queued"
    # One Sync: the thread's runs and its checkpoint read together (two before).
    assert len(traced.messages("Sync")) == 1, traced.messages("")
    assert len(traced.messages("Execute")) == 2
    ((answering, answered, read),) = seen
    assert answering and answered and answered == read
    assert Run.objects.filter(kind="resume", status="queued").count() == 1
