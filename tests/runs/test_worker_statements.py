"""What a worker asks of Postgres for one refund run, on its own connection:
the claim, each side effect's ledger writes, the finish.

The test is the worker: it executes the runs in this process
(runs.execution.execute), so that its statements can be counted. No task is
sent to the broker, where a worker another test module left running would
take the run first. The checkpoint store writes on LangGraph's executor
threads (their connections are not counted here: bench/peers.py counts
everything)."""

import threading
import time
import uuid

import pytest
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.test.utils import CaptureQueriesContext

from approvals.models import ApprovalRequest
from audit.models import AuditEvent
from runs import execution, streaming
from runs.checkpointer import DjangoSaver, head_fingerprint_sql
from runs.crypto import ThreadCipher
from runs.graphs import thread_config
from runs.models import Run, Thread, ToolCall
from runs.signals import InterruptRejected, run_interrupted
from tests.factories import REFUND_INPUT, tenant_with_client

pytestmark = pytest.mark.django_db(transaction=True)


class _Transactions:
    """Commits on this process's main connection, counted."""

    def __init__(self, monkeypatch) -> None:
        self.count = 0
        wrapper = connections[DEFAULT_DB_ALIAS]  # this thread's
        commit = wrapper._commit

        def counted():
            self.count += 1
            return commit()

        monkeypatch.setattr(wrapper, "_commit", counted)


def _statements(sql: list[str], start: str, table: str) -> list[str]:
    """The statements that start with `start` and name `table` before any
    SET or WHERE."""
    return [
        s
        for s in sql
        if s.startswith(start) and f'"{table}"' in s.split("SET")[0].split("WHERE")[0]
    ]


def test_a_runs_bookkeeping_writes_are_each_one_statement_with_their_event(
    dispatched, monkeypatch
):
    tenant, client = tenant_with_client()
    client.post(
        "/api/v1/threads", {"thread_id": "t-1", "agent": "refund"}, format="json"
    )
    client.post("/api/v1/threads/t-1/runs", {"input": REFUND_INPUT}, format="json")
    execution.execute(dispatched.pop())
    approval_id = client.get("/api/v1/threads/t-1").json()["pending_approvals"][0]
    decided = client.post(
        f"/api/v1/approvals/{approval_id}/decision",
        {"approved": True, "reviewer": "rita"},
        format="json",
    )
    resumed = decided.json()["resumed_run"]["run_id"]

    transactions = _Transactions(monkeypatch)
    with CaptureQueriesContext(connection) as captured:
        execution.execute(dispatched.pop())
    assert Run.objects.get(pk=resumed).status == Run.Status.SUCCEEDED
    sql = [q["sql"] for q in captured.captured_queries]
    with_event = [s for s in sql if s.startswith("WITH w0 AS")]
    assert all('"audit_auditevent"' in s for s in with_event)

    # Two calls (the refund, the customer's message), each `started` then
    # `succeeded`: each write with its event in one statement, outside any
    # transaction of its own.
    ledger = [s for s in sql if '"runs_toolcall"' in s]
    assert len(ledger) == 4 and set(ledger) <= set(with_event), ledger
    # The claim: a read of the run, its thread and tenant, locking nothing,
    # and the run saved in the statement of its event, which locks the
    # thread and the run; in autocommit. The finish of a success: the run
    # and the thread saved in the statement of the event, which locks the
    # thread and checks the lease and the thread's head; in autocommit too.
    claim = _statements(sql, "WITH w0 AS (UPDATE", "runs_run")
    assert len(claim) == 2 and "FOR NO KEY UPDATE" in claim[0]
    assert "FOR NO KEY UPDATE" in claim[1] and '"runs_thread"' in claim[1]
    assert "lease_owner = " in claim[1] and "md5(" in claim[1]
    assert not _statements(sql, "UPDATE", "runs_run")
    assert not _statements(sql, "UPDATE", "runs_thread")
    # The claim's read of the run (no lock) and the finish's look-up of the
    # thread's next queued run after its statement; no locking read.
    run_reads = [s for s in sql if s.startswith('SELECT "runs_run"')]
    assert len(run_reads) == 2 and "FOR " not in run_reads[0]
    assert sql.index(run_reads[0]) < sql.index(claim[0])
    finish_lock = 'FOR NO KEY UPDATE OF "runs_thread", "runs_run"'
    assert not [s for s in sql if s.endswith(finish_lock)]
    assert len(with_event) == 6 and not [s for s in sql if s.startswith("SAVEPOINT")]
    # None: not for the claim, nor for the ledger, nor for the downstream
    # systems' inserts (the demo's payment provider and outbox), each a
    # statement of its own, nor for the finish.
    assert transactions.count == 0
    assert (
        sorted(
            AuditEvent.objects.filter(
                run_id=resumed, kind__startswith="tool_call."
            ).values_list("kind", flat=True)
        )
        == ["tool_call.started"] * 2 + ["tool_call.succeeded"] * 2
    )
    assert set(ToolCall.objects.values_list("status", flat=True)) == {"succeeded"}
    thread = client.get("/api/v1/threads/t-1").json()
    assert thread["status"] == "idle"


def test_a_gates_request_is_inserted_in_the_statement_of_its_event(dispatched):
    """The run that stops at the refund's gate: its request inserted with
    `approval.requested` in one statement, no look-up before it and no
    savepoint around the receivers."""
    tenant, client = tenant_with_client()
    client.post(
        "/api/v1/threads", {"thread_id": "t-1", "agent": "refund"}, format="json"
    )
    client.post("/api/v1/threads/t-1/runs", {"input": REFUND_INPUT}, format="json")
    with CaptureQueriesContext(connection) as captured:
        execution.execute(dispatched.pop())
    sql = [q["sql"] for q in captured.captured_queries]
    requests = [s for s in sql if '"approvals_approvalrequest"' in s]
    assert len(requests) == 1, requests
    assert requests[0].startswith("WITH w0 AS (INSERT INTO")
    assert '"audit_auditevent"' in requests[0]
    assert not [s for s in sql if s.startswith("SAVEPOINT")]
    (request,) = ApprovalRequest.objects.all()
    assert request.status == "pending" and request.risk == "low"
    event = AuditEvent.objects.for_tenant(tenant).get(kind="approval.requested")
    assert event.data["approval_id"] == str(request.pk)
    assert Run.objects.get(pk=request.run_id).status == Run.Status.INTERRUPTED


def test_a_threads_first_run_looks_for_no_checkpoint_to_start_from(
    dispatched, monkeypatch
):
    """The claim reads whether the thread has a checkpoint, and its latest,
    with the run: on its first run the graph starts from none without
    asking, on a later run (the resume) from the one the claim read, without
    asking either. Neither reads its state back once the graph stopped
    (built from the saver's copy: tests/runs/test_final_state.py)."""
    reads: list[str] = []
    query = DjangoSaver._query

    def counted(self, statements):
        reads.extend(sql for sql, _ in statements)
        return query(self, statements)

    monkeypatch.setattr(DjangoSaver, "_query", counted)
    tenant, client = tenant_with_client()
    client.post(
        "/api/v1/threads", {"thread_id": "t-1", "agent": "refund"}, format="json"
    )
    client.post("/api/v1/threads/t-1/runs", {"input": REFUND_INPUT}, format="json")
    execution.execute(dispatched.pop())
    assert reads == []
    assert Run.objects.get().status == Run.Status.INTERRUPTED
    approval_id = client.get("/api/v1/threads/t-1").json()["pending_approvals"][0]
    reads.clear()
    client.post(
        f"/api/v1/approvals/{approval_id}/decision",
        {"approved": True, "reviewer": "rita"},
        format="json",
    )
    reads.clear()  # the decision's gate check reads the state too
    execution.execute(dispatched.pop())
    # The resume: the interrupted checkpoint read by the claim, nothing after.
    assert reads == []
    assert Run.objects.filter(status=Run.Status.SUCCEEDED).count() == 1


def test_the_claim_reads_the_threads_head_as_the_saver_would(dispatched, monkeypatch):
    """The checkpoint the claim's first read finds with the run is the one
    the saver's get_tuple reads, its blobs and writes (the interrupt's)
    included; a saver that adopts the thread with it answers the graph's
    first read from it without a query, keeps it as its head (the finish's
    fingerprint is the database's), and queries for any later read."""
    tenant, client = tenant_with_client()
    client.post(
        "/api/v1/threads", {"thread_id": "t-1", "agent": "refund"}, format="json"
    )
    client.post("/api/v1/threads/t-1/runs", {"input": REFUND_INPUT}, format="json")
    execution.execute(dispatched.pop())
    approval_id = client.get("/api/v1/threads/t-1").json()["pending_approvals"][0]
    client.post(
        f"/api/v1/approvals/{approval_id}/decision",
        {"approved": True, "reviewer": "rita"},
        format="json",
    )
    (run,) = execution._PEEK_RUN(uuid.UUID(str(dispatched.pop())))
    thread = run.thread
    head = execution._head_read_with(run)
    assert head is not None and head[1] and head[2]  # blobs and writes too
    reads: list[str] = []
    query = DjangoSaver._query

    def counted(self, statements):
        reads.extend(sql for sql, _ in statements)
        return query(self, statements)

    monkeypatch.setattr(DjangoSaver, "_query", counted)
    saver = DjangoSaver(tenant=tenant)
    saver.adopt(thread, ThreadCipher.for_thread(thread), head=head)
    answered = saver.get_tuple(thread_config(thread))
    assert reads == []
    assert answered == DjangoSaver(tenant=tenant).get_tuple(thread_config(thread))
    assert answered.pending_writes
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {head_fingerprint_sql('%s')}", [thread.pk])
        (stored,) = cursor.fetchone()
    assert saver.head(thread.pk)[1] == stored
    reads.clear()
    assert saver.get_tuple(thread_config(thread)) == answered
    assert len(reads) == 1  # only the first read is answered


def test_a_rejected_interrupt_rolls_back_what_the_receivers_wrote(dispatched):
    """A receiver of run_interrupted that rejects the interrupt after another
    one opened its request: neither the request nor its event commits, and
    the run fails with the receiver's message."""

    def reject(sender, **kwargs):
        raise InterruptRejected("the payload says nothing a reviewer can judge")

    tenant, client = tenant_with_client()
    client.post(
        "/api/v1/threads", {"thread_id": "t-1", "agent": "refund"}, format="json"
    )
    run_id = client.post(
        "/api/v1/threads/t-1/runs", {"input": REFUND_INPUT}, format="json"
    ).json()["run_id"]
    run_interrupted.connect(reject, dispatch_uid="tests.reject")
    try:
        execution.execute(dispatched.pop())
    finally:
        run_interrupted.disconnect(dispatch_uid="tests.reject")
    run = Run.objects.get(pk=run_id)
    assert run.status == Run.Status.FAILED
    assert run.error_type == "InterruptRejected"
    assert run.next_nodes == ["request_approval"]
    body = client.get(f"/api/v1/threads/t-1/runs/{run_id}").json()
    assert "a reviewer can judge" in body["error"]
    assert not ApprovalRequest.objects.exists()
    kinds = set(AuditEvent.objects.for_tenant(tenant).values_list("kind", flat=True))
    assert "run.failed" in kinds and "approval.requested" not in kinds
    assert client.get("/api/v1/threads/t-1").json()["status"] == "error"


def test_the_start_and_the_decision_save_their_rows_with_their_events(dispatched):
    """Over the API: the started run inserted in the statement of its
    run.queued; the decision inserted, and the request it settles updated,
    in the statement of approval.decided, and the resumed run in that of its
    run.queued."""
    tenant, client = tenant_with_client()
    client.post(
        "/api/v1/threads", {"thread_id": "t-1", "agent": "refund"}, format="json"
    )
    with CaptureQueriesContext(connection) as started:
        client.post("/api/v1/threads/t-1/runs", {"input": REFUND_INPUT}, format="json")
    (queued,) = [q["sql"] for q in started if 'INSERT INTO "runs_run"' in q["sql"]]
    assert queued.startswith("WITH w0 AS (INSERT") and '"audit_auditevent"' in queued
    execution.execute(dispatched.pop())
    approval_id = client.get("/api/v1/threads/t-1").json()["pending_approvals"][0]
    with CaptureQueriesContext(connection) as decided:
        response = client.post(
            f"/api/v1/approvals/{approval_id}/decision",
            {"approved": True, "reviewer": "rita"},
            format="json",
        )
    assert response.status_code == 200, response.content
    sql = [q["sql"] for q in decided]
    (decision,) = [s for s in sql if 'INSERT INTO "approvals_decision"' in s]
    assert decision.startswith("WITH w0 AS (INSERT")
    assert 'UPDATE "approvals_approvalrequest"' in decision
    assert '"audit_auditevent"' in decision
    assert not [s for s in sql if s.startswith('UPDATE "approvals_approvalrequest"')]
    (queued,) = [s for s in sql if 'INSERT INTO "runs_run"' in s]
    assert queued.startswith("WITH w0 AS (INSERT") and '"audit_auditevent"' in queued
    request = ApprovalRequest.objects.get(pk=approval_id)
    assert request.status == "approved" and request.decisions.count() == 1
    resumed = Run.objects.get(pk=response.json()["resumed_run"]["run_id"])
    assert resumed.status == Run.Status.QUEUED and resumed.kind == Run.Kind.RESUME
    events = AuditEvent.objects.for_tenant(tenant).order_by("seq")
    assert list(events.values_list("kind", flat=True))[-3:] == [
        "approval.decided",
        "approval.read",
        "run.queued",
    ]


def test_a_run_queued_while_the_finish_waits_for_the_thread_is_dispatched(
    dispatched,
):
    """The finish locks the run and its thread in one statement; a run queued
    by a transaction that held the thread's lock meanwhile (its claim found
    this run still running, and left it to this finish) is looked up after
    the finish commits: a subquery of the locking statement would read the
    runs as they were when the statement started, without it."""
    tenant, client = tenant_with_client()
    client.post(
        "/api/v1/threads", {"thread_id": "t-1", "agent": "refund"}, format="json"
    )
    client.post("/api/v1/threads/t-1/runs", {"input": REFUND_INPUT}, format="json")
    run_id = dispatched.pop()
    owner = execution.new_lease_owner()
    run, thread = execution._claim(run_id, owner)
    publisher = streaming.Publisher(
        run_id=run.id, attempt=run.attempts, cipher=ThreadCipher.for_thread(thread)
    )
    held, queued = threading.Event(), []

    def queue_behind_the_lock():
        try:
            with transaction.atomic():
                locked = Thread.objects.select_for_update(no_key=True).get(pk=thread.pk)
                queued.append(
                    Run.objects.create(
                        tenant=tenant,
                        thread=locked,
                        kind=Run.Kind.START,
                        agent_version=run.agent_version,
                    ).pk
                )
                held.set()
                # Until the finish waits for the thread's lock.
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline and not _waits_for_a_lock():
                    time.sleep(0.01)
        finally:
            connection.close()

    holder = threading.Thread(target=queue_behind_the_lock)
    holder.start()
    assert held.wait(10)
    execution._finish(run_id, owner, execution.Outcome(), publisher)
    holder.join()
    assert Run.objects.get(pk=run_id).status == Run.Status.SUCCEEDED
    assert [str(pk) for pk in dispatched] == [str(pk) for pk in queued]


def _waits_for_a_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = "
            "current_database() AND wait_event_type = 'Lock'"
        )
        return cursor.fetchone()[0] > 0
