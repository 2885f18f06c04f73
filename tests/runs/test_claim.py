"""A worker's claim of a queued run whose turn it is: one statement, in
autocommit, that writes only if what the claim read still holds once it has
the thread's lock; otherwise the claim under the locks decides.

The test is the worker (runs.execution._claim, in this process); a second
connection, on a thread of its own, holds the thread's lock and changes
things while the claim waits for it."""

import threading
import time

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from audit.models import AuditEvent
from runs import dispatch, execution
from runs.models import Run, Thread
from tests.factories import REFUND_INPUT, tenant_with_client

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def queued(monkeypatch):
    """A new thread's queued run: (tenant, thread, run id); not dispatched."""
    runs: list[str] = []
    monkeypatch.setattr(dispatch, "run_dispatch", lambda run_id: runs.append(run_id))
    tenant, client = tenant_with_client()
    client.post(
        "/api/v1/threads", {"thread_id": "t-1", "agent": "refund"}, format="json"
    )
    client.post("/api/v1/threads/t-1/runs", {"input": REFUND_INPUT}, format="json")
    return tenant, Thread.objects.get(thread_id="t-1"), str(runs.pop())


def _started(run_id: str) -> list[str]:
    return list(
        AuditEvent.objects.filter(run_id=run_id, kind="run.started").values_list(
            "kind", flat=True
        )
    )


def test_a_queued_run_is_claimed_in_one_statement_without_a_transaction(queued):
    _, thread, run_id = queued
    with CaptureQueriesContext(connection) as captured:
        claimed = execution._claim(run_id, "worker-a")
    assert claimed is not None
    run, claimed_thread = claimed
    sql = [q["sql"] for q in captured.captured_queries]
    assert len(sql) == 2 and "FOR " not in sql[0], sql
    assert sql[1].startswith('WITH w0 AS (UPDATE "runs_run"') and "FOR NO KEY" in sql[1]
    stored = Run.objects.get(pk=run_id)
    assert (stored.status, stored.lease_owner, stored.attempts) == (
        "running",
        "worker-a",
        1,
    )
    assert stored.started_at == run.started_at and run.first_attempt
    assert claimed_thread.pk == thread.pk and claimed_thread.tenant_id
    assert _started(run_id) == ["run.started"]
    # Delivered again: the run is taken, nothing more is written.
    assert execution._claim(run_id, "worker-b") is None
    assert _started(run_id) == ["run.started"]


def _while_the_thread_is_locked(thread: Thread, change) -> threading.Event:
    """Lock the thread on a connection of another thread, `change()` there,
    and commit a moment after the claim started waiting for the lock."""
    locked, done = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                Thread.objects.select_for_update(no_key=True).get(pk=thread.pk)
                change()
                locked.set()
                time.sleep(0.5)
        finally:
            connection.close()
            done.set()

    threading.Thread(target=hold, daemon=True).start()
    assert locked.wait(10)
    return done


def test_a_run_cancelled_while_the_claim_waits_for_its_thread_is_not_taken(queued):
    _, thread, run_id = queued
    done = _while_the_thread_is_locked(
        thread,
        lambda: Run.objects.filter(pk=run_id).update(
            status=Run.Status.CANCELLED, cancel_action=Run.CancelAction.INTERRUPT
        ),
    )
    started = time.monotonic()
    assert execution._claim(run_id, "worker-a") is None
    assert time.monotonic() - started > 0.2  # it waited for the lock
    assert done.wait(10)
    assert Run.objects.get(pk=run_id).status == Run.Status.CANCELLED
    assert _started(run_id) == []


def test_a_thread_deleted_while_the_claim_waits_for_it_is_not_run(queued):
    _, thread, run_id = queued
    from django.utils import timezone

    done = _while_the_thread_is_locked(
        thread,
        lambda: Thread.objects.filter(pk=thread.pk).update(deleted_at=timezone.now()),
    )
    assert execution._claim(run_id, "worker-a") is None
    assert done.wait(10)
    assert Run.objects.get(pk=run_id).status == Run.Status.QUEUED
    assert _started(run_id) == []


def test_a_claim_that_waited_for_its_thread_takes_the_run_after(queued):
    _, thread, run_id = queued
    done = _while_the_thread_is_locked(thread, lambda: None)
    assert execution._claim(run_id, "worker-a") is not None
    assert done.wait(10)
    assert Run.objects.get(pk=run_id).lease_owner == "worker-a"
    assert _started(run_id) == ["run.started"]


def test_a_run_behind_another_is_left_queued(queued):
    tenant, thread, run_id = queued
    ahead = Run.objects.get(pk=run_id)
    behind = Run.objects.create(
        tenant=tenant,
        thread=thread,
        kind=Run.Kind.START,
        status=Run.Status.QUEUED,
        agent_version=ahead.agent_version,
    )
    assert execution._claim(str(behind.pk), "worker-a") is None
    assert execution._claim(run_id, "worker-a") is not None
    assert execution._claim(str(behind.pk), "worker-b") is None
    assert Run.objects.get(pk=behind.pk).status == Run.Status.QUEUED


def test_a_thread_not_marked_running_is_claimed_under_the_locks(queued):
    """What the one statement does not write (the thread's status) the claim
    under the locks does, as before."""
    _, thread, run_id = queued
    Thread.objects.filter(pk=thread.pk).update(status=Thread.Status.IDLE)
    with CaptureQueriesContext(connection) as captured:
        assert execution._claim(run_id, "worker-a") is not None
    assert any("FOR NO KEY UPDATE" in q["sql"] for q in captured.captured_queries)
    assert Thread.objects.get(pk=thread.pk).status == Thread.Status.RUNNING
    assert _started(run_id) == ["run.started"]
