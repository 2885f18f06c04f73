"""The late-write rule for a run's lease: once a worker's run has lost its
lease (taken over by another worker after the lease ran out: a frozen
process, a partition), none of its checkpoint writes reaches the thread,
and it stops recording nothing; writes made outside a run keep the
thread-alive rule alone.

The test is the worker: it executes runs in this process
(runs.execution.execute), the frozen attempt on a thread of its own, as a
worker process frozen mid-step (SIGSTOP, a GC pause) would be.
"""

import operator
import threading
from datetime import timedelta
from typing import Annotated, TypedDict

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.graph import END, START, StateGraph

from audit.models import AuditEvent
from audit.services import Actor
from gatehouse import durable
from runs import execution, graph_executor, services, storage
from runs.checkpointer import DjangoSaver
from runs.crypto import ThreadCipher, ThreadDeleted
from runs.graphs import compile_for, thread_config
from runs.models import (
    Checkpoint,
    LeaseLost,
    PendingWrite,
    Run,
    Tenant,
    Thread,
    ToolCall,
)
from tests.factories import make_tenant, tenant_with_client

pytestmark = pytest.mark.django_db(transaction=True)

# --- the checkpoint store -------------------------------------------------------------


def _running(owner: str = "w:1") -> tuple[Thread, Run]:
    tenant = make_tenant()
    thread = services.thread_create(
        tenant=tenant, agent="echo", actor=Actor.system("tests"), thread_id="t-1"
    )
    run = Run.objects.create(
        tenant=tenant,
        thread=thread,
        kind="start",
        agent_version="1",
        status=Run.Status.RUNNING,
        lease_owner=owner,
        lease_until=timezone.now() + timedelta(seconds=30),
    )
    return thread, run


def _leased_saver(thread: Thread, run: Run, owner: str = "w:1") -> DjangoSaver:
    saver = DjangoSaver(tenant=thread.tenant)
    saver.adopt(thread, ThreadCipher.for_thread(thread), lease=(run.pk, owner))
    return saver


def _put(saver: DjangoSaver, text: str, parent: dict | None = None) -> dict:
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"text": text, "long": text * 600}
    checkpoint["channel_versions"] = {
        channel: saver.get_next_version(None, None) for channel in ("text", "long")
    }
    config = {"configurable": {"thread_id": "t-1", "checkpoint_ns": ""}}
    if parent:
        config["configurable"]["checkpoint_id"] = parent["configurable"][
            "checkpoint_id"
        ]
    metadata = {"source": "loop", "step": 0}
    return saver.put(config, checkpoint, metadata, checkpoint["channel_versions"])


def _rows(thread: Thread) -> tuple[int, int]:
    return (
        Checkpoint.objects.filter(thread=thread).count(),
        PendingWrite.objects.filter(thread=thread).count(),
    )


@pytest.mark.parametrize(
    "lost",
    [
        {"lease_owner": "w:2"},  # taken over by another worker's claim
        {"status": Run.Status.CANCELLED, "lease_owner": ""},  # stopped for good
    ],
    ids=["taken-over", "no-longer-running"],
)
def test_a_write_for_a_run_that_lost_its_lease_is_refused(lost):
    thread, run = _running()
    saver = _leased_saver(thread, run)
    stored = _put(saver, "before")
    saver.put_writes(stored, [("text", "pending")], "task-1")
    saver.put_writes(stored, [("__interrupt__", "asked")], "task-2")
    assert _rows(thread) == (1, 2)

    Run.objects.filter(pk=run.pk).update(**lost)

    with pytest.raises(LeaseLost, match="lost its lease"):
        _put(saver, "late", parent=stored)
    with pytest.raises(LeaseLost):
        saver.put_writes(stored, [("text", "late")], "task-3")
    with pytest.raises(LeaseLost):  # an upsert (special channel) as well
        saver.put_writes(stored, [("__interrupt__", "late")], "task-2")
    assert _rows(thread) == (1, 2)
    latest = saver.get_tuple(thread_config(thread))
    assert latest.checkpoint["channel_values"]["text"] == "before"
    assert {write[2] for write in latest.pending_writes} == {"pending", "asked"}


@pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])
def test_a_write_for_a_run_that_lost_its_lease_is_refused_on_sqlite():
    """The embedded mode's database: every write takes the transactional
    path, which checks the lease after the thread's row."""
    tenant = Tenant.objects.using("sqlite").create(slug="embedded", name="E")
    thread = Thread.objects.using("sqlite").create_with_data_key(
        tenant=tenant, thread_id="t-1"
    )
    run = Run.objects.using("sqlite").create(
        tenant=tenant,
        thread=thread,
        kind="start",
        agent_version="1",
        status=Run.Status.RUNNING,
        lease_owner="w:1",
    )
    saver = DjangoSaver(tenant=tenant, using="sqlite")
    saver.adopt(thread, ThreadCipher.for_thread(thread), lease=(run.pk, "w:1"))
    stored = _put(saver, "before")
    saver.put_writes(stored, [("text", "pending")], "task-1")

    Run.objects.using("sqlite").filter(pk=run.pk).update(lease_owner="w:2")
    with pytest.raises(LeaseLost):
        _put(saver, "late", parent=stored)
    with pytest.raises(LeaseLost):
        saver.put_writes(stored, [("text", "late")], "task-2")
    assert Checkpoint.objects.using("sqlite").filter(thread=thread).count() == 1
    assert PendingWrite.objects.using("sqlite").filter(thread=thread).count() == 1


@pytest.mark.parametrize("other", ["cancel", "takeover"])
def test_a_first_delta_write_and_a_lock_of_thread_then_run_do_not_deadlock(other):
    """A thread's first DeltaChannel checkpoint takes the transactional path,
    which marks the thread (an UPDATE of its row). Done after the run's
    lease lock (FOR SHARE), it closed a cycle with a cancel or a takeover's
    claim, which lock the thread (FOR NO KEY UPDATE) and then the run: one
    of the two was killed by Postgres's deadlock detection."""
    thread, run = _running()
    saver = _leased_saver(thread, run)
    marking, go = threading.Event(), threading.Event()
    mark = saver._mark_delta

    def held_while_marking(live):
        marking.set()
        go.wait(10)
        return mark(live)

    saver._mark_delta = held_while_marking
    errors = {}

    def in_thread(name, work):
        def target():
            try:
                work()
            except Exception as error:  # reported by the assertion below
                errors[name] = error
            finally:
                connection.close()

        worker = threading.Thread(target=target)
        worker.start()
        return worker

    def delta_put():
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"text": "x"}
        checkpoint["channel_versions"] = {"text": saver.get_next_version(None, None)}
        config = {"configurable": {"thread_id": "t-1", "checkpoint_ns": ""}}
        metadata = {"source": "loop", "step": 0, "counters_since_delta_snapshot": {}}
        saver.put(config, checkpoint, metadata, checkpoint["channel_versions"])

    def lock_thread_then_run():
        if other == "cancel":
            services.run_cancel(
                thread=Thread.objects.get(pk=thread.pk),
                run=run,
                actor=Actor.system("tests"),
                action="interrupt",
            )
        else:
            execution._claim_locked(run.pk, "w:2")

    writer = in_thread("write", delta_put)
    assert marking.wait(10)
    locker = in_thread(other, lock_thread_then_run)
    locker.join(0.5)  # let it take the thread's lock and wait for the run's
    go.set()
    writer.join(20)
    locker.join(20)
    assert not writer.is_alive() and not locker.is_alive()
    assert errors == {}
    assert Thread.objects.get(pk=thread.pk).uses_delta_channels


def test_a_lease_that_ran_out_but_was_not_taken_still_writes():
    """The lease's token decides, as for the finish: a lease past its time
    that no claim took is still this worker's (it renews it, if it can)."""
    thread, run = _running()
    saver = _leased_saver(thread, run)
    Run.objects.filter(pk=run.pk).update(lease_until=timezone.now() - timedelta(1))
    _put(saver, "still mine")
    assert _rows(thread) == (1, 0)


def test_writes_outside_a_run_keep_the_thread_alive_rule():
    """A state update, a fork, the shell: no lease to check, only the thread."""
    thread, run = _running()
    leased = _leased_saver(thread, run)
    stored = _put(leased, "before")
    Run.objects.filter(pk=run.pk).update(lease_owner="w:2")

    outside = DjangoSaver(tenant=thread.tenant)  # as update_state's is
    forked = _put(outside, "forked", parent=stored)
    outside.put_writes(forked, [("text", "update")], "task-1")
    # Adopted without a lease (a run's saver from before this change, say).
    plain = DjangoSaver(tenant=thread.tenant)
    plain.adopt(thread, ThreadCipher.for_thread(thread))
    _put(plain, "plain", parent=forked)
    assert _rows(thread) == (3, 1)


def test_a_leased_write_to_a_deleted_thread_is_refused_as_deleted():
    """The thread-deleted refusal is as before, lease held or not."""
    thread, run = _running()
    saver = _leased_saver(thread, run)
    stored = _put(saver, "before")
    storage.thread_destroy(thread=Thread.objects.get(pk=thread.pk))

    with pytest.raises(ThreadDeleted, match="refusing a late write"):
        _put(saver, "late", parent=stored)
    with pytest.raises(ThreadDeleted):
        saver.put_writes(stored, [("text", "late")], "task-1")
    assert _rows(thread) == (0, 0)


def test_a_leased_write_is_one_statement():
    """The lease is checked in the write's own statement: no other query."""
    thread, run = _running()
    saver = _leased_saver(thread, run)
    statements: list[str] = []
    write = saver._write_returning

    def counted(sql, params):
        statements.append(sql)
        return write(sql, params)

    saver._write_returning = counted
    with CaptureQueriesContext(connection) as orm:
        stored = _put(saver, "one")
        saver.put_writes(stored, [("text", "pending")], "task-1")
        saver.put_writes(stored, [("__interrupt__", "asked")], "task-2")
    assert len(statements) == 3 and orm.captured_queries == []
    assert all(f"JOIN {Run._meta.db_table} r" in sql for sql in statements)


# --- a worker frozen while another takes its run over ---------------------------------


class HoldState(TypedDict, total=False):
    steps: Annotated[list, operator.add]
    reserved: dict


class Freezer:
    """The first call of `hold` freezes (its worker stopped mid-step) until
    released; later calls, the worker's that took the run over, go through."""

    def __init__(self) -> None:
        self.calls = 0
        self.frozen = threading.Event()
        self.release = threading.Event()
        self.undone: list = []


FREEZER = Freezer()


def undo(args: dict, result: dict, key: str) -> dict:
    FREEZER.undone.append(key)
    return {"undone": True}


def _reserve(state: HoldState) -> HoldState:
    reserved = durable.side_effect(
        "test.reserve", {"what": "seat"}, lambda key: {"seat": 1}, compensate=undo
    )
    return {"steps": ["reserve"], "reserved": reserved}


def _hold(state: HoldState) -> HoldState:
    FREEZER.calls += 1
    if FREEZER.calls == 1:
        FREEZER.frozen.set()
        FREEZER.release.wait(60)
        return {"steps": ["late"]}
    return {"steps": ["taker"]}


def _last(state: HoldState) -> HoldState:
    if "late" in state["steps"]:
        raise ValueError("the late attempt went on")  # compensation, if it ran
    return {"steps": ["last"]}


def hold_graph() -> StateGraph:
    graph = StateGraph(HoldState)
    graph.add_node("reserve", _reserve)
    graph.add_node("hold", _hold)
    graph.add_node("last", _last)
    graph.add_edge(START, "reserve")
    graph.add_edge("reserve", "hold")
    graph.add_edge("hold", "last")
    graph.add_edge("last", END)
    return graph


hold_graph.actions = []


@pytest.fixture
def freezer(settings):
    settings.GATEHOUSE_AGENTS += ",hold@1=tests.runs.test_late_writes:hold_graph"
    global FREEZER
    FREEZER = Freezer()
    yield FREEZER
    FREEZER.release.set()


def _frozen_attempt(run_id: str, done: list) -> threading.Thread:
    def attempt() -> None:
        try:
            execution.execute(run_id)
            done.append("returned")
        except BaseException as error:  # noqa: BLE001  reported by the test
            done.append(error)
        finally:
            graph_executor.shut_down()
            connection.close()

    thread = threading.Thread(target=attempt, daemon=True)
    thread.start()
    return thread


def _all_steps(thread: Thread) -> list[list]:
    """Every checkpoint's `steps` and every pending write's value, decrypted."""
    graph = compile_for(thread)
    seen = []
    for snapshot in graph.get_state_history(thread_config(thread)):
        seen.append(list(snapshot.values.get("steps", [])))
        saved = graph.checkpointer.get_tuple(snapshot.config)
        seen += [
            value if isinstance(value, list) else [value]
            for _, _, value in saved.pending_writes or []
        ]
    return seen


def test_a_run_taken_over_from_a_frozen_worker_writes_nothing_after(
    dispatched, freezer, caplog
):
    _, client = tenant_with_client()
    client.post("/api/v1/threads", {"thread_id": "t-1", "agent": "hold"}, format="json")
    client.post("/api/v1/threads/t-1/runs", {"input": {}}, format="json")
    run_id = dispatched.pop()

    done: list = []
    frozen = _frozen_attempt(run_id, done)
    assert freezer.frozen.wait(60), "the first attempt never reached `hold`"
    first = Run.objects.get(pk=run_id)
    thread = Thread.objects.get(pk=first.thread_id)
    written = Checkpoint.objects.filter(thread=thread).count()
    # Frozen: its process renews nothing, and its lease runs out.
    execution.LEASES.release(first.pk)
    Run.objects.filter(pk=run_id).update(lease_until=timezone.now() - timedelta(1))

    execution.execute(run_id)  # the recovery sweep's worker takes it over
    taken = Run.objects.get(pk=run_id)
    assert taken.status == Run.Status.SUCCEEDED and taken.attempts == 2
    after_takeover = Checkpoint.objects.filter(thread=thread).count()
    writes_after_takeover = PendingWrite.objects.filter(thread=thread).count()
    assert after_takeover > written

    freezer.release.set()  # the frozen worker wakes up and carries on
    frozen.join(60)
    assert done == ["returned"]

    # Nothing it did after the loss reached the thread.
    assert Checkpoint.objects.filter(thread=thread).count() == after_takeover
    assert PendingWrite.objects.filter(thread=thread).count() == writes_after_takeover
    assert all("late" not in steps for steps in _all_steps(thread))
    state = compile_for(thread).get_state(thread_config(thread))
    assert state.values["steps"] == ["reserve", "taker", "last"]
    # No outcome recorded by it: the run is the taker's, as it left it.
    run = Run.objects.get(pk=run_id)
    assert (run.status, run.error_type, run.compensation) == ("succeeded", "", "")
    kinds = list(
        AuditEvent.objects.filter(run_id=run_id)
        .order_by("seq")
        .values_list("kind", flat=True)
    )
    assert kinds.count("run.succeeded") == 1
    assert not {"run.failed", "run.compensating", "run.compensated"} & set(kinds)
    # No compensation, no undoing in the ledger.
    assert freezer.undone == []
    assert not ToolCall.objects.filter(compensates__isnull=False).exists()
    thread.refresh_from_db()
    assert thread.status == Thread.Status.IDLE
    # It stopped at its first write after the loss, recording nothing.
    assert "lost its lease; refusing its write" in caplog.text
    assert "stopped, nothing recorded" in caplog.text
