"""Every response that decrypts thread content leaves exactly one `*.read`
audit event, whatever it lists (issue 16, finding 6), on /api/v1 and in the
admin; another tenant's object is a 404 and leaves none. The Agent Protocol's
reads: tests/agent_protocol/test_read_audit.py.

The paths that return decrypted content, and their event:

| path | event |
|---|---|
| GET /api/v1/threads/{id} (interrupt values) | thread.read |
| GET /api/v1/threads/{id}/state[/{checkpoint}] | thread.state_read |
| GET /api/v1/threads/{id}/runs, .../runs/{id} (errors of failed runs) | run.read |
| GET /api/v1/approvals/{id} (payload, decisions) | approval.read (detail) |
| POST /api/v1/approvals/{id}/decision (the same, in its answer) | approval.read (decision) |
| admin: a thread's state (?checkpoint=) | thread.state_read |
| admin: a request's card (payload, decisions, the thread's context) | approval.read (card) |
| admin: the queue (each row's payload) | approval.list_read, per tenant |

GET /api/v1/threads/{id}/history decrypts checkpoints but answers structure
only (ids, step, source, next): no content, no event. Lists of threads and
approvals decrypt nothing.
"""

import pytest

from approvals.models import ApprovalRequest
from audit.events import READS, REGISTRY
from audit.models import AuditEvent
from runs.models import Run, Thread
from tests.approvals.helpers import logged_in
from tests.factories import make_member, tenant_with_client
from tests.runs.test_approvals_flow import interrupted_thread

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

READ_KINDS = sorted(READS)


def reads(tenant=None) -> list[AuditEvent]:
    events = AuditEvent.objects.filter(kind__in=READ_KINDS).order_by("id")
    return list(events if tenant is None else events.filter(tenant=tenant))


def one_read(tenant, call) -> AuditEvent:
    """Make the request; exactly one read event, of the tenant, is new."""
    before = {event.pk for event in reads()}
    response = call()
    assert response.status_code == 200, response.content[:500]
    new = [event for event in reads() if event.pk not in before]
    assert len(new) == 1, [event.kind for event in new]
    assert new[0].tenant_id == tenant.pk
    return new[0]


def no_read(call, status=404) -> None:
    before = len(reads())
    response = call()
    assert response.status_code == status, response.content[:500]
    assert len(reads()) == before


def test_every_read_kind_is_one_the_admin_can_hide_or_show_alone():
    assert {kind for kind in REGISTRY if kind.endswith("read")} == READS


def test_each_api_read_of_content_is_one_event_and_another_tenants_404_none(
    worker,
):
    tenant, client = tenant_with_client()
    _, stranger = tenant_with_client()
    interrupted_thread(client, "gate", thread_id="t1")
    failed = interrupted_thread(client, "incomplete", thread_id="f1")
    assert failed.status == Run.Status.FAILED
    approval = ApprovalRequest.objects.get()
    checkpoint = client.get("/api/v1/threads/t1/state").json()["checkpoint_id"]

    expected = {
        "/api/v1/threads/t1": ("thread.read", {"interrupts": 1}),
        "/api/v1/threads/t1/state": ("thread.state_read", {}),
        f"/api/v1/threads/t1/state/{checkpoint}": ("thread.state_read", {}),
        "/api/v1/threads/f1/runs": ("run.read", {"runs": 1}),
        f"/api/v1/threads/f1/runs/{failed.pk}": ("run.read", {"runs": 1}),
        f"/api/v1/approvals/{approval.pk}": ("approval.read", {"how": "detail"}),
    }
    for path, (kind, data) in expected.items():
        for _ in range(2):  # each request, not each first request
            event = one_read(tenant, lambda path=path: client.get(path))
            assert event.kind == kind, path
            assert data.items() <= event.data.items(), path
            assert event.actor_type == "api_key"
        no_read(lambda path=path: stranger.get(path))

    # Neither lists nor the history show content: no event.
    for path in ("/api/v1/threads", "/api/v1/approvals", "/api/v1/threads/t1/history"):
        no_read(lambda path=path: client.get(path), status=200)

    decide = f"/api/v1/approvals/{approval.pk}/decision"
    body = {"approved": False, "note": "no"}
    no_read(lambda: stranger.post(decide, body, format="json"))
    event = one_read(tenant, lambda: client.post(decide, body, format="json"))
    assert event.kind == "approval.read" and event.data["how"] == "decision"


def test_each_admin_read_of_content_is_one_event_and_another_tenants_none(worker):
    tenant, client = tenant_with_client()
    other, other_client = tenant_with_client()
    interrupted_thread(client, "gate", thread_id="t1")
    interrupted_thread(other_client, "gate", thread_id="t1")
    thread = Thread.objects.get(tenant=tenant)
    approval = ApprovalRequest.objects.get(tenant=tenant)
    officer = logged_in(make_member(tenant, role="compliance_officer").user)
    outsider = logged_in(make_member(other, role="compliance_officer").user)

    state = f"/admin/runs/thread/{thread.pk}/change/?checkpoint=latest"
    card = f"/admin/approvals/approvalrequest/{approval.pk}/change/"
    queue = "/admin/approvals/approvalrequest/"
    for path, kind in (
        (state, "thread.state_read"),
        (card, "approval.read"),
        (queue, "approval.list_read"),
    ):
        for _ in range(2):
            event = one_read(tenant, lambda path=path: officer.get(path))
            assert event.kind == kind, path
            assert event.actor_type == "user"
    assert event.data["count"] == 1
    assert event.data["approval_ids"] == [str(approval.pk)]
    card_read = AuditEvent.objects.filter(tenant=tenant, kind="approval.read").first()
    assert card_read.data["how"] == "card" and card_read.data["checkpoint_id"]

    for path in (state, card):
        no_read(lambda path=path: outsider.get(path))
    # The other tenant's officer sees their own request only, and reads it.
    event = one_read(other, lambda: outsider.get(queue))
    assert event.data["count"] == 1
    # A thread's page without its state decrypts nothing.
    no_read(lambda: officer.get(f"/admin/runs/thread/{thread.pk}/change/"), 200)
