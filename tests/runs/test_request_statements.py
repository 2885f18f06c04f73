"""What the hot API requests cost in statements: each row read once, the
thread written once per request."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from agent_protocol import shapes
from runs.models import Thread
from tests.factories import tenant_with_client

# Inside the test's transaction: nothing commits, so no run is sent to a
# worker (a live one left by another module would take it).
pytestmark = pytest.mark.django_db


def _statements(queries, verb: str, table: str) -> int:
    return sum(
        1
        for q in queries
        if q["sql"].startswith(verb) and f'"{table}"' in q["sql"].split("WHERE")[0]
    )


def test_a_new_thread_is_written_once_with_its_key_and_its_event():
    """Its id taken first, its row goes in with its data key, in the
    statement that records thread.created: no UPDATE for the key."""
    from audit import services as audit_services
    from audit.models import AuditEvent
    from runs.crypto import ThreadCipher

    tenant, client = tenant_with_client()
    # The tenant's first event makes its sequence row; as if that had
    # committed (nothing does in this test), later events take one statement.
    first = client.post("/api/v1/threads", {"agent": "refund"}, format="json")
    assert first.status_code == 201, first.content
    audit_services._SEQUENCED.add(tenant.pk)
    try:
        with CaptureQueriesContext(connection) as captured:
            created = client.post(
                "/api/v1/threads",
                {"thread_id": "t-1", "agent": "refund"},
                format="json",
            )
    finally:
        audit_services._SEQUENCED.discard(tenant.pk)
    assert created.status_code == 201, created.content
    queries = captured.captured_queries
    assert _statements(queries, "UPDATE", "runs_thread") == 0
    # No look-up first: a live thread with the id makes the insert do nothing.
    assert _statements(queries, "SELECT", "runs_thread") == 0
    inserts = [q["sql"] for q in queries if 'INSERT INTO "runs_thread"' in q["sql"]]
    assert len(inserts) == 1 and "audit_auditevent" in inserts[0]
    assert "ON CONFLICT DO NOTHING" in inserts[0]
    thread = Thread.objects.get(thread_id="t-1")
    assert thread.wrapped_data_key and thread.data_key_id
    ThreadCipher.for_thread(thread)  # its key unwraps, bound to its id
    assert AuditEvent.objects.filter(
        kind="thread.created", thread_id="t-1"
    ).count() == 1


def test_starting_a_run_reads_and_writes_its_thread_once_and_reads_its_runs_once():
    _, client = tenant_with_client()
    created = client.post(
        "/api/v1/threads", {"thread_id": "t-1", "agent": "refund"}, format="json"
    )
    assert created.status_code == 201
    with CaptureQueriesContext(connection) as captured:
        started = client.post(
            "/api/v1/threads/t-1/runs",
            {"input": {"customer_message": "hi", "order": {"id": "A-1"}}},
            format="json",
        )
    assert started.status_code == 202, started.content
    queries = captured.captured_queries
    # Found and locked in one statement.
    assert _statements(queries, "SELECT", "runs_thread") == 1
    assert "FOR NO KEY UPDATE" in next(
        q["sql"] for q in queries if q["sql"].startswith('SELECT "runs_thread"')
    )
    # Pinned to its version and running, in one UPDATE.
    assert _statements(queries, "UPDATE", "runs_thread") == 1
    # The active runs once (locked, for the multitask strategy).
    assert _statements(queries, "SELECT", "runs_run") == 1
    thread = Thread.objects.get(thread_id="t-1")
    assert (thread.agent_version, thread.status) == ("1", Thread.Status.RUNNING)


def test_following_a_run_reads_it_no_second_time():
    """The join/wait/stream views read the thread and the run; opening the
    run's output records the read and reads neither again."""
    from agent_protocol import relay
    from agent_protocol.views.base import ProtocolView
    from audit.services import Actor

    tenant, client = tenant_with_client()
    client.post(
        "/api/v1/threads", {"thread_id": "t-2", "agent": "refund"}, format="json"
    )
    run_id = client.post(
        "/api/v1/threads/t-2/runs",
        {"input": {"customer_message": "hi", "order": {"id": "A-2"}}},
        format="json",
    ).json()["run_id"]
    view = ProtocolView()
    view.request = type("R", (), {"principal": type("P", (), {"tenant": tenant})})()
    run = view.run("t-2", run_id)
    with CaptureQueriesContext(connection) as captured:
        relay._open(relay.Target.of(run, Actor.system("tests")), "join")
    sql = [q["sql"] for q in captured.captured_queries]
    assert not [s for s in sql if s.startswith("SELECT")], sql
    assert len([s for s in sql if 'INSERT INTO "audit_auditevent"' in s]) == 1


def test_an_agent_protocol_run_start_ends_on_its_audit_event():
    """The tenant's audit sequence row is held from the `run.queued` event
    to the commit: nothing comes between them, not even the release of a
    savepoint (the run services' transaction is the request's own)."""
    _, client = tenant_with_client()
    thread_id = client.post("/langgraph/threads", {}, format="json").json()["thread_id"]
    with CaptureQueriesContext(connection) as captured:
        started = client.post(
            f"/langgraph/threads/{thread_id}/runs",
            {
                "assistant_id": "refund",
                "input": {"customer_message": "hi", "order": {"id": "A-3"}},
            },
            format="json",
        )
    assert started.status_code == 200, started.content
    sql = [q["sql"] for q in captured.captured_queries]
    # In this test's transaction the request's own is a savepoint: one.
    assert len([s for s in sql if s.startswith("SAVEPOINT")]) == 1, sql
    event = next(
        i for i, s in enumerate(sql) if 'INSERT INTO "audit_auditevent"' in s
    )
    assert sql[event + 1].startswith("RELEASE SAVEPOINT"), sql[event:]


def test_an_agent_protocol_run_start_reads_its_thread_once_locked():
    """As /api/v1's: the thread found and locked in one statement, not read
    again by the run services nor for the answer (its agent bound on the row
    read under the lock); the same for a start that creates its thread."""
    _, client = tenant_with_client()
    thread_id = client.post("/langgraph/threads", {}, format="json").json()["thread_id"]
    body = {
        "assistant_id": "refund",
        "input": {"customer_message": "hi", "order": {"id": "A-4"}},
    }
    with CaptureQueriesContext(connection) as captured:
        started = client.post(
            f"/langgraph/threads/{thread_id}/runs", body, format="json"
        )
    assert started.status_code == 200, started.content
    assert started.json()["assistant_id"] == shapes.assistant_id_of("refund", "1")
    queries = captured.captured_queries
    assert _statements(queries, "SELECT", "runs_thread") == 1
    assert "FOR NO KEY UPDATE" in next(
        q["sql"] for q in queries if q["sql"].startswith('SELECT "runs_thread"')
    )
    with CaptureQueriesContext(connection) as captured:
        created = client.post(
            "/langgraph/threads/t-new/runs",
            {**body, "if_not_exists": "create"},
            format="json",
        )
    assert created.status_code == 200, created.content
    # Not found, then made, then found and locked with the run's start.
    assert _statements(captured.captured_queries, "SELECT", "runs_thread") == 2
    assert Thread.objects.get(thread_id="t-new").status == Thread.Status.RUNNING


def test_the_approvals_list_reads_a_page_in_one_statement_of_what_it_shows():
    """The summary's columns and the thread's id, and no query per row for
    a column left out."""
    from datetime import timedelta

    from django.utils import timezone

    from approvals.api.serializers import ApprovalSummarySerializer
    from approvals.models import ApprovalRequest

    tenant, client = tenant_with_client()
    for n in range(3):
        created = client.post(
            "/api/v1/threads", {"thread_id": f"t-{n}", "agent": "refund"}, format="json"
        )
        assert created.status_code == 201
        started = client.post(
            f"/api/v1/threads/t-{n}/runs",
            {"input": {"customer_message": "hi", "order": {"id": "A-1"}}},
            format="json",
        )
        assert started.status_code == 202, started.content
        thread = Thread.objects.get(thread_id=f"t-{n}")
        ApprovalRequest.objects.create(
            tenant=tenant,
            thread=thread,
            run=thread.runs.get(),
            interrupt_id=f"i-{n}",
            action="payments.refund",
            payload=b"sealed",
            due_at=timezone.now() + timedelta(hours=1),
        )
    with CaptureQueriesContext(connection) as captured:
        listed = client.get("/api/v1/approvals?status=pending&limit=2")
    assert listed.status_code == 200, listed.content
    page = listed.json()
    assert [row["thread_id"] for row in page["results"]] == ["t-2", "t-1"]
    assert set(page["results"][0]) == set(ApprovalSummarySerializer().fields)
    assert page["next"]
    [query] = [q["sql"] for q in captured.captured_queries if "approvals_" in q["sql"]]
    assert '"payload"' not in query and '"runs_tenant"' not in query
