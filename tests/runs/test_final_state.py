"""The state a worker records a run with, built from its saver's copy of the
checkpoint the run last wrote (runs.execution._read_state), is the state a
read of the database gives (LangGraph's get_state through the saver's
get_tuple), in every case: interrupts (one, two in parallel branches, two in
one node, an input interrupt), a success through the ledger, a failure; and
when another writer changed the thread's head between the end of the run's
graph and its finish, the database's state is the one recorded.

The test is the worker: it executes the runs in this process
(runs.execution.execute), as tests/runs/test_worker_statements.py does.
"""

from datetime import timedelta
from typing import Annotated, TypedDict

import pytest
from django.db import connection
from django.utils import timezone
from langgraph.channels import DeltaChannel
from langgraph.constants import CONFIG_KEY_CHECKPOINTER
from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

from audit import events
from audit.models import AuditEvent
from audit.services import Actor, ChainedWriteMissed, record_with_write
from audit.signals import event_recorded
from runs import execution, streaming
from runs.checkpointer import head_fingerprint_sql
from runs.fixed_queries import update_statement
from runs.graphs import compile_for, thread_config
from runs.models import Run, Thread
from tests.agents import provider_marker
from tests.factories import REFUND_INPUT, tenant_with_client

pytestmark = pytest.mark.django_db(transaction=True)

NULL_TASK_ID = "00000000-0000-0000-0000-000000000000"


def _stored_fingerprint(thread_pk: int) -> str | None:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {head_fingerprint_sql('%s')}", [thread_pk])
        return cursor.fetchone()[0]


@pytest.fixture
def compared(monkeypatch):
    """Every state the worker builds from its saver's copy, compared with the
    database's as read at that moment: the whole snapshot (values, next
    nodes, tasks with their interrupts, metadata, configs, time), and the
    copy's fingerprint with the one the finish's statement computes."""
    seen: list[dict] = []
    read_state = execution._read_state

    def checked(outcome, graph, thread):
        state = read_state(outcome, graph, thread)
        database = graph.get_state(thread_config(thread))
        seen.append(
            {
                "outcome": outcome,
                "copy": outcome.head is not None,
                # Recorded, not asserted here: the worker would take an
                # assertion for the agent's failure.
                "same": state == database
                and outcome.head in (None, _stored_fingerprint(thread.pk)),
            }
        )
        return state

    monkeypatch.setattr(execution, "_read_state", checked)
    return seen


def _thread(client, agent: str, thread_id: str = "t-1") -> Thread:
    client.post(
        "/api/v1/threads", {"thread_id": thread_id, "agent": agent}, format="json"
    )
    return Thread.objects.get(thread_id=thread_id)


def _decide(client, dispatched, thread_id: str = "t-1") -> None:
    approval_id = client.get(f"/api/v1/threads/{thread_id}").json()[
        "pending_approvals"
    ][0]
    response = client.post(
        f"/api/v1/approvals/{approval_id}/decision",
        {"approved": True, "reviewer": "rita"},
        format="json",
    )
    assert response.status_code == 200, response.json()
    execution.execute(dispatched.pop())


def _concat(state: list, writes: list) -> list:
    return [*state, *(item for write in writes for item in write)]


class DeltaLog(TypedDict, total=False):
    log: Annotated[list, DeltaChannel(_concat, snapshot_frequency=3)]
    turns: int


def _speak(state: DeltaLog) -> DeltaLog:
    turn = state.get("turns", 0) + 1
    return {"log": [f"turn {turn}"], "turns": turn}


def _ask_more(state: DeltaLog) -> DeltaLog:
    return {"log": [interrupt({"question": "More?"})]}


def delta_graph() -> StateGraph:
    """Four turns on a DeltaChannel (its value rebuilt from the writes of
    the checkpoints since its last snapshot), an input interrupt, a turn."""
    graph = StateGraph(DeltaLog)
    graph.add_node("speak", _speak)
    graph.add_node("ask", _ask_more)
    graph.add_node("last", _speak)
    graph.add_edge(START, "speak")
    graph.add_conditional_edges(
        "speak", lambda s: "speak" if s["turns"] < 4 else "ask", ["speak", "ask"]
    )
    graph.add_edge("ask", "last")
    graph.add_edge("last", END)
    return graph


delta_graph.actions = []


def _status(thread_id: str = "t-1") -> str:
    return Run.objects.filter(thread__thread_id=thread_id).latest("created_at").status


def test_the_refund_flows_states_are_the_databases(dispatched, compared):
    _, client = tenant_with_client()
    _thread(client, "refund")
    client.post("/api/v1/threads/t-1/runs", {"input": REFUND_INPUT}, format="json")
    execution.execute(dispatched.pop())
    assert _status() == "interrupted"
    _decide(client, dispatched)  # through the ledger: a payment, an email
    assert _status() == "succeeded"
    # Both executions took the copy, and each matched the database's read.
    assert [(entry["copy"], entry["same"]) for entry in compared] == [(True, True)] * 2


def test_parallel_interrupts_and_a_partial_resume_are_the_databases(
    dispatched, compared
):
    _, client = tenant_with_client()
    _thread(client, "duo")
    client.post("/api/v1/threads/t-1/runs", {"input": {}}, format="json")
    execution.execute(dispatched.pop())
    assert len(compared[-1]["outcome"].interrupts) == 2
    _decide(client, dispatched)  # one branch goes on, the other still waits
    assert len(compared[-1]["outcome"].interrupts) == 1
    _decide(client, dispatched)
    assert _status() == "succeeded"
    assert [(entry["copy"], entry["same"]) for entry in compared] == [(True, True)] * 3


def test_two_interrupts_of_one_node_and_an_input_interrupt_are_the_databases(
    dispatched, compared
):
    _, client = tenant_with_client()
    _thread(client, "twice")
    client.post("/api/v1/threads/t-1/runs", {"input": {}}, format="json")
    execution.execute(dispatched.pop())
    _decide(client, dispatched)
    assert _status() == "interrupted"  # at the node's second gate
    _decide(client, dispatched)
    assert _status() == "succeeded"
    _thread(client, "chat", "t-2")
    client.post("/api/v1/threads/t-2/runs", {"input": {}}, format="json")
    execution.execute(dispatched.pop())
    assert _status("t-2") == "interrupted"
    response = client.post(
        "/api/v1/threads/t-2/resume", {"resume": "Ada"}, format="json"
    )
    assert response.status_code == 202, response.json()
    execution.execute(dispatched.pop())
    assert _status("t-2") == "succeeded"
    assert [(entry["copy"], entry["same"]) for entry in compared] == [(True, True)] * 5


def test_a_delta_channels_state_is_the_databases(dispatched, compared, settings):
    settings.GATEHOUSE_AGENTS += ",delta@1=tests.runs.test_final_state:delta_graph"
    _, client = tenant_with_client()
    _thread(client, "delta")
    client.post("/api/v1/threads/t-1/runs", {"input": {}}, format="json")
    execution.execute(dispatched.pop())
    assert _status() == "interrupted"
    assert compared[-1]["outcome"].values["log"] == [f"turn {n}" for n in range(1, 5)]
    response = client.post(
        "/api/v1/threads/t-1/resume", {"resume": "yes"}, format="json"
    )
    assert response.status_code == 202, response.json()
    execution.execute(dispatched.pop())
    assert _status() == "succeeded"
    assert compared[-1]["outcome"].values["log"][-2:] == ["yes", "turn 5"]
    assert [(entry["copy"], entry["same"]) for entry in compared] == [(True, True)] * 2


def test_a_failed_run_records_the_databases_state(dispatched, compared):
    _, client = tenant_with_client()
    thread = _thread(client, "flaky")
    client.post("/api/v1/threads/t-1/runs", {"input": {}}, format="json")
    execution.execute(dispatched.pop())
    provider_marker(thread.pk).unlink(missing_ok=True)
    _decide(client, dispatched)  # the provider is down: the run fails
    assert _status() == "failed"
    # The failure's state is the database's (_final_values), never the copy.
    assert [(entry["copy"], entry["same"]) for entry in compared] == [(True, True)]


def test_a_foreign_write_to_the_head_before_the_finish_records_the_databases(
    dispatched, compared, monkeypatch
):
    """Another writer adds a write to the head after the run's graph ended
    (as nothing may while the run is running; a bug or an operator's hand):
    the finish's fingerprint differs, and the outcome is the database's,
    which applies the write to the values."""
    _, client = tenant_with_client()
    thread = _thread(client, "gate")
    read_state = execution._read_state
    copies: list = []

    def then_written(outcome, graph, thread):
        state = read_state(outcome, graph, thread)
        copies.append((outcome.head, list(outcome.values.get("answers", []))))
        other = compile_for(Thread.objects.get(pk=thread.pk))  # its own saver
        other.checkpointer.put_writes(
            state.config, [("answers", [{"foreign": True}])], NULL_TASK_ID
        )
        return state

    monkeypatch.setattr(execution, "_read_state", then_written)
    # The state read again under the run's lease (a failure to read it is
    # undone by compensation, which must not outlive the lease).
    held: list[bool] = []
    read_again = execution._read_again

    def observed(run, *args):
        held.append(run.id in execution.LEASES._held)
        return read_again(run, *args)

    monkeypatch.setattr(execution, "_read_again", observed)
    client.post("/api/v1/threads/t-1/runs", {"input": {}}, format="json")
    run_id = dispatched.pop()
    execution.execute(run_id)
    assert held == [True]
    assert all(str(held_run) != run_id for held_run in execution.LEASES._held)
    (head, answers), outcome = copies[0], compared[0]["outcome"]
    thread.refresh_from_db()
    assert head is not None and {"foreign": True} not in answers
    assert compared[0]["same"]  # until the foreign write
    # Read again from the database: the foreign write is in the values.
    assert outcome.head is None
    database = compile_for(thread).get_state(thread_config(thread))
    assert outcome.values == database.values
    assert {"foreign": True} in outcome.values["answers"]
    assert _status() == "interrupted"


def test_a_foreign_checkpoint_before_the_finish_records_the_databases(
    dispatched, compared, monkeypatch
):
    """A state update by another saver after the run's graph ended: a new
    head. The run is recorded with the database's state, past the gate."""
    _, client = tenant_with_client()
    _thread(client, "gate")
    read_state = execution._read_state

    def then_updated(outcome, graph, thread):
        state = read_state(outcome, graph, thread)
        other = compile_for(Thread.objects.get(pk=thread.pk))
        other.update_state(thread_config(thread), {"answers": []}, as_node="ask")
        return state

    monkeypatch.setattr(execution, "_read_state", then_updated)
    client.post("/api/v1/threads/t-1/runs", {"input": {}}, format="json")
    execution.execute(dispatched.pop())
    outcome = compared[0]["outcome"]
    assert compared[0]["copy"] and compared[0]["same"]  # until the update
    assert outcome.head is None and outcome.interrupts == []
    assert _status() == "succeeded"  # what the database's head says


def test_a_run_that_lost_its_lease_records_nothing_with_the_copy(
    dispatched, compared, monkeypatch
):
    """The late-write rule holds with the copy: the finish checks the lease
    before anything, and a run taken over is not recorded."""
    _, client = tenant_with_client()
    _thread(client, "gate")
    read_state = execution._read_state

    def then_taken(outcome, graph, thread):
        state = read_state(outcome, graph, thread)
        Run.objects.filter(thread_id=thread.pk).update(lease_owner="other:1:x")
        return state

    monkeypatch.setattr(execution, "_read_state", then_taken)
    client.post("/api/v1/threads/t-1/runs", {"input": {}}, format="json")
    execution.execute(dispatched.pop())
    run = Run.objects.get()
    assert run.status == "running" and run.lease_owner == "other:1:x"
    assert compared[0]["copy"] and compared[0]["same"]


def test_a_head_changed_after_the_lease_ran_out_is_left_to_the_sweep(
    dispatched, compared, monkeypatch
):
    """The state is read again (and a failure undone) only under a lease
    renewed at once: one already run out, still in this worker's name,
    leaves the run to the recovery sweep, recorded by nobody."""
    _, client = tenant_with_client()
    _thread(client, "gate")
    read_state = execution._read_state

    def then_written_late(outcome, graph, thread):
        state = read_state(outcome, graph, thread)
        other = compile_for(Thread.objects.get(pk=thread.pk))
        other.checkpointer.put_writes(
            state.config, [("answers", [{"late": True}])], NULL_TASK_ID
        )
        Run.objects.filter(thread_id=thread.pk).update(
            lease_until=timezone.now() - timedelta(seconds=1)
        )
        return state

    read_again: list = []
    monkeypatch.setattr(execution, "_read_state", then_written_late)
    monkeypatch.setattr(execution, "_read_again", lambda *a: read_again.append(a))
    client.post("/api/v1/threads/t-1/runs", {"input": {}}, format="json")
    execution.execute(dispatched.pop())
    run = Run.objects.get()
    assert read_again == []
    assert run.status == "running" and run.lease_until < timezone.now()
    assert run.id not in execution.LEASES._held


def test_the_copy_answers_only_its_threads_latest_checkpoint(dispatched):
    """The saver that answers the copy reads any other checkpoint."""
    _, client = tenant_with_client()
    thread = _thread(client, "gate")
    client.post("/api/v1/threads/t-1/runs", {"input": {}}, format="json")
    execution.execute(dispatched.pop())
    thread.refresh_from_db()
    graph = compile_for(thread)
    latest = graph.get_state(thread_config(thread))
    saver = graph.checkpointer.answering(
        graph.checkpointer.get_tuple(thread_config(thread))._replace(metadata={})
    )
    config = thread_config(thread)
    config["configurable"][CONFIG_KEY_CHECKPOINTER] = saver
    assert graph.get_state(config).metadata == {}
    earlier = latest.parent_config["configurable"]["checkpoint_id"]
    config = thread_config(thread, earlier)
    config["configurable"][CONFIG_KEY_CHECKPOINTER] = saver
    assert (
        graph.get_state(config).metadata
        == graph.get_state(thread_config(thread, earlier)).metadata
    )
    assert graph.get_state(config).metadata


# --- A success recorded in one statement (_record_success_at_once) -----------


def _succeeded_events(run_id) -> int:
    return AuditEvent.objects.filter(run_id=str(run_id), kind="run.succeeded").count()


def test_a_success_that_lost_its_lease_writes_nothing(dispatched, monkeypatch):
    """The one statement's lease condition: a run taken over before its
    finish is not recorded succeeded, and no event says it was."""
    _, client = tenant_with_client()
    thread = _thread(client, "echo")
    read_state = execution._read_state

    def then_taken(outcome, graph, thread):
        state = read_state(outcome, graph, thread)
        Run.objects.filter(thread_id=thread.pk).update(lease_owner="other:1:x")
        return state

    monkeypatch.setattr(execution, "_read_state", then_taken)
    client.post("/api/v1/threads/t-1/runs", {"input": {"text": "hi"}}, format="json")
    execution.execute(dispatched.pop())
    run = Run.objects.get()
    assert run.status == "running" and run.lease_owner == "other:1:x"
    assert _succeeded_events(run.pk) == 0
    thread.refresh_from_db()
    assert thread.status == "running"


def test_a_success_whose_thread_was_deleted_writes_nothing(dispatched, monkeypatch):
    _, client = tenant_with_client()
    thread = _thread(client, "echo")
    read_state = execution._read_state

    def then_deleted(outcome, graph, thread):
        state = read_state(outcome, graph, thread)
        Thread.objects.filter(pk=thread.pk).update(deleted_at=timezone.now())
        return state

    monkeypatch.setattr(execution, "_read_state", then_deleted)
    client.post("/api/v1/threads/t-1/runs", {"input": {"text": "hi"}}, format="json")
    execution.execute(dispatched.pop())
    run = Run.objects.get()
    assert run.status == "running" and _succeeded_events(run.pk) == 0
    assert Thread.objects.get(pk=thread.pk).status == "running"


def test_a_success_whose_head_changed_records_the_databases_state(
    dispatched, compared, monkeypatch
):
    """The one statement's head condition: a foreign write to the head
    after the graph ended, and the success is recorded by the locked path
    with the state read from the database (once: one event)."""
    _, client = tenant_with_client()
    thread = _thread(client, "echo")
    read_state = execution._read_state

    def then_written(outcome, graph, thread):
        state = read_state(outcome, graph, thread)
        other = compile_for(Thread.objects.get(pk=thread.pk))
        other.checkpointer.put_writes(
            state.config, [("echoed", "theirs")], NULL_TASK_ID
        )
        return state

    monkeypatch.setattr(execution, "_read_state", then_written)
    client.post("/api/v1/threads/t-1/runs", {"input": {"text": "hi"}}, format="json")
    execution.execute(dispatched.pop())
    run = Run.objects.get()
    outcome = compared[0]["outcome"]
    assert compared[0]["copy"] and compared[0]["same"]  # until the write
    assert outcome.head is None and outcome.values["echoed"] == "theirs"
    assert run.status == "succeeded" and _succeeded_events(run.pk) == 1
    thread.refresh_from_db()
    assert thread.status == "idle"


def test_chained_writes_are_all_or_nothing_in_autocommit():
    """record_with_write(chained=True): where the first write wrote and a
    later one found no row, the statement fails whole: the first's row is
    not changed and no event is recorded (in autocommit: no transaction to
    roll back)."""
    tenant, client = tenant_with_client()
    thread = _thread(client, "echo")
    before = AuditEvent.objects.count()
    status = thread.status
    thread.status = "error" if status != "error" else "idle"
    first = update_statement(thread, ("status",))
    other = Thread.objects.get(pk=thread.pk)
    other.metadata = {"x": 1}
    second = update_statement(
        other, ("metadata",), where=("EXISTS (SELECT 1 FROM w0) AND false", ())
    )
    assert connection.get_autocommit()
    with pytest.raises(ChainedWriteMissed):
        record_with_write(
            first,
            second,
            chained=True,
            tenant=tenant,
            kind=events.THREAD_CREATED,
            actor=Actor.system("test"),
            thread_id=thread.thread_id,
            run_id="",
            data={"agent": "echo"},
        )
    assert Thread.objects.get(pk=thread.pk).status == status
    assert AuditEvent.objects.count() == before


def test_a_success_in_one_statement_publishes_its_end_before_its_event_is_announced(
    dispatched, monkeypatch
):
    """As after a commit (runs.wakeups): the waiting clients first, the
    receivers of the event (the webhooks' look-ups) after."""
    order = []
    publish = streaming.Publisher.publish

    def published(self, name, *args, **kwargs):
        order.append(("published", name))
        return publish(self, name, *args, **kwargs)

    def announced(sender, event, **kwargs):
        order.append(("announced", event.kind))

    monkeypatch.setattr(streaming.Publisher, "publish", published)
    _, client = tenant_with_client()
    _thread(client, "echo")
    client.post("/api/v1/threads/t-1/runs", {"input": {"text": "hi"}}, format="json")
    event_recorded.connect(announced, dispatch_uid="test-final-state")
    try:
        order.clear()
        execution.execute(dispatched.pop())
    finally:
        event_recorded.disconnect(dispatch_uid="test-final-state")
    assert Run.objects.get().status == "succeeded"
    assert order.index(("published", streaming.END)) < order.index(
        ("announced", "run.succeeded")
    ), order
