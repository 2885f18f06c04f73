"""What stands between a decision and its resumed run's worker: the
request's lock and the read of its decisions are one round trip, and the
run's task is sent before the decision's answer is rendered (the worker
waits for the task; the answer's rendering needs nothing that the commit
could change)."""

import pytest
from django.db import connection
from psycopg import pq

from approvals.api import views
from runs import dispatch
from tests.approvals.helpers import waiting_request
from tests.factories import api_client, make_api_key, make_tenant

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("idempotency_key", [None, "decide-once"])
def test_the_resumed_runs_task_is_sent_before_the_answer_is_rendered(
    monkeypatch, idempotency_key
):
    order = []
    monkeypatch.setattr(
        dispatch, "_send", lambda name, args, options: order.append(("sent", name))
    )
    render = views._render

    def rendered(*args, **kwargs):
        order.append(("rendered", None))
        return render(*args, **kwargs)

    monkeypatch.setattr(views, "_render", rendered)
    tenant = make_tenant()
    approval = waiting_request(tenant)
    _, secret = make_api_key(tenant, ["approvals"])
    headers = {"HTTP_IDEMPOTENCY_KEY": idempotency_key} if idempotency_key else {}
    response = api_client(secret).post(
        f"/api/v1/approvals/{approval.pk}/decision",
        {"approved": True, "reviewer": "ops"},
        format="json",
        **headers,
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "approved" and body["resumed_run"]["status"] == "queued"
    assert [d["approved"] for d in body["decisions"]] == [True]
    if idempotency_key is None:
        assert order == [("sent", dispatch.EXECUTE_RUN), ("rendered", None)]
    else:
        # The reservation, the work and the stored answer commit together:
        # the answer is rendered (and stored) before the commit sends the task.
        assert order == [("rendered", None), ("sent", dispatch.EXECUTE_RUN)]


def test_an_answer_that_cannot_be_decrypted_fails_the_decision_with_it(monkeypatch):
    """Only the formatting of the answer waits for the commit: a failure to
    decrypt what it shows (a key, a ciphertext) rolls the decision back,
    never a 500 for a decision recorded, with its read, that nobody saw."""
    from approvals.models import ApprovalRequest
    from audit.models import AuditEvent
    from runs.crypto import CryptoError
    from runs.models import Run

    def undecryptable(*args, **kwargs):
        raise CryptoError("the thread's key cannot be unwrapped")

    monkeypatch.setattr(views, "approval_view", undecryptable)
    tenant = make_tenant()
    approval = waiting_request(tenant)
    _, secret = make_api_key(tenant, ["approvals"])
    client = api_client(secret)
    response = client.post(
        f"/api/v1/approvals/{approval.pk}/decision",
        {"approved": True, "reviewer": "ops"},
        format="json",
    )
    assert response.status_code == 409, response.content  # as any CryptoError
    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.PENDING
    assert not Run.objects.filter(thread=approval.thread, kind=Run.Kind.RESUME).exists()
    assert not AuditEvent.objects.filter(
        tenant=tenant, kind__in=["approval.decided", "approval.read"]
    ).exists()


def test_the_request_is_locked_and_its_decisions_read_in_one_round_trip(tmp_path):
    tenant = make_tenant()
    approval = waiting_request(tenant)
    _, secret = make_api_key(tenant, ["approvals"])
    client = api_client(secret)
    client.get("/api/v1/approvals")  # the key verified
    trace = tmp_path / "trace"
    with open(trace, "w") as file:
        pgconn = connection.connection.pgconn
        pgconn.trace(file.fileno())
        pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
        try:
            response = client.post(
                f"/api/v1/approvals/{approval.pk}/decision",
                {"approved": True, "reviewer": "ops"},
                format="json",
            )
        finally:
            pgconn.untrace()
    assert response.status_code == 200, response.content
    sent = [line for line in trace.read_text().splitlines() if line.startswith("F\t")]
    lock = next(i for i, line in enumerate(sent) if "FOR NO KEY UPDATE OF" in line)
    insert = next(
        i for i, line in enumerate(sent) if 'INSERT INTO "approvals_decision"' in line
    )
    between = sent[lock:insert]
    # The decisions' read was sent with the lock, and both end at one Sync.
    assert sum('FROM "approvals_decision"' in line for line in between) == 1
    assert sum(line.endswith("\tSync") for line in between) == 1, between
