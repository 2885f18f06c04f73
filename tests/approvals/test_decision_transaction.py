"""A decision over the API is one transaction: the decision, the run it
resumes, and the read of the answer (which shows the payload), with the rows
it locked read once."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from audit import events
from audit import services as audit_services
from audit.models import AuditEvent
from runs.models import Run
from tests.approvals.helpers import waiting_request
from tests.factories import api_client, make_api_key, make_tenant

# Inside the test's transaction: the view's transaction is a savepoint, and
# nothing commits, so the resumed run is never sent to a worker (a live one
# left by another module would take it).
pytestmark = pytest.mark.django_db


def _reads(queries, table: str) -> int:
    return sum(
        1
        for q in queries
        if q["sql"].startswith("SELECT") and f'FROM "{table}"' in q["sql"]
    )


def test_a_decision_is_one_transaction_that_reads_each_row_once():
    tenant = make_tenant()
    approval = waiting_request(tenant)
    _, secret = make_api_key(tenant, ["approvals"])
    client = api_client(secret)
    client.get("/api/v1/approvals")  # the key verified (no key query below)
    # The tenant's sequence row is there (its earlier events made it); as if
    # that had committed (nothing does in this test), a write and its event
    # take one statement.
    audit_services._SEQUENCED.add(tenant.pk)
    try:
        with CaptureQueriesContext(connection) as captured:
            response = client.post(
                f"/api/v1/approvals/{approval.pk}/decision",
                {"approved": True, "reviewer": "ops"},
                format="json",
            )
    finally:
        audit_services._SEQUENCED.discard(tenant.pk)
    assert response.status_code == 200, response.content
    assert response.json()["resumed_run"]["status"] == "queued"
    sql = [q["sql"] for q in captured.captured_queries]
    # One transaction (here a savepoint in the test's), none inside it.
    opened = [i for i, s in enumerate(sql) if s.startswith("SAVEPOINT")]
    released = [i for i, s in enumerate(sql) if s.startswith("RELEASE SAVEPOINT")]
    assert len(opened) == 1 and len(released) == 1, sql
    begin, commit = opened[0], released[0]
    # The request and its thread found and locked in one read, in the
    # transaction, the request's row first (the lock order); the decisions
    # once (before the new one).
    assert not [s for s in sql[:begin] if '"approvals_approvalrequest"' in s]
    first = sql[begin + 1]
    assert first.startswith("SELECT") and 'FROM "approvals_approvalrequest"' in first
    assert first.endswith(
        'FOR NO KEY UPDATE OF "approvals_approvalrequest", "runs_thread"'
    ), first
    # No other statement reads the thread's row (the resume's look at the
    # thread's runs is framed on it and selects none of its columns).
    thread_rows = [s for s in sql if '"runs_thread"."status"' in s.split(" FROM ")[0]]
    assert thread_rows == [first], thread_rows
    assert _reads(captured.captured_queries, "approvals_decision") == 1
    # The read of the answer is recorded in the decision's transaction, in
    # the statement of the decision's event, next to it.
    audit_inserts = [
        i for i, s in enumerate(sql) if 'INSERT INTO "audit_auditevent"' in s
    ]
    assert len(audit_inserts) == 2 and all(begin < i < commit for i in audit_inserts)
    assert 'INSERT INTO "approvals_decision"' in sql[audit_inserts[0]]
    kinds = list(
        AuditEvent.objects.filter(tenant=tenant)
        .order_by("seq")
        .values_list("kind", flat=True)
    )[-3:]
    assert kinds == [
        e.name
        for e in (events.APPROVAL_DECIDED, events.APPROVAL_READ, events.RUN_QUEUED)
    ]
    assert Run.objects.filter(thread=approval.thread, kind=Run.Kind.RESUME).count() == 1


def test_a_refused_decision_records_nothing():
    tenant = make_tenant()
    approval = waiting_request(tenant)
    _, secret = make_api_key(tenant, ["approvals"])
    client = api_client(secret)
    url = f"/api/v1/approvals/{approval.pk}/decision"
    assert client.post(url, {"approved": True}, format="json").status_code == 200
    before = AuditEvent.objects.filter(tenant=tenant).count()
    again = client.post(url, {"approved": True}, format="json")
    assert again.status_code == 409
    assert again.json()["code"] == "already_decided"
    assert AuditEvent.objects.filter(tenant=tenant).count() == before
