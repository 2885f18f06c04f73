"""The decision endpoint honours Idempotency-Key: a retried decision is the
first one, replayed; never a second decision."""

import pytest

from approvals.models import Decision
from audit.models import AuditEvent
from retention.jobs import job_run
from runs import crypto
from runs.crypto import CryptoError
from runs.models import IdempotencyRecord, Run
from tests.approvals.helpers import waiting_request
from tests.factories import api_client, make_api_key, make_member, make_tenant

pytestmark = pytest.mark.django_db


def test_a_retried_decision_replays_the_first_response():
    tenant = make_tenant()
    approval = waiting_request(tenant)
    _, secret = make_api_key(tenant, ["approvals"])
    client = api_client(secret)
    url = f"/api/v1/approvals/{approval.pk}/decision"
    body = {"approved": True, "note": "Photo checked."}
    first = client.post(url, body, format="json", HTTP_IDEMPOTENCY_KEY="decide-1")
    again = client.post(url, body, format="json", HTTP_IDEMPOTENCY_KEY="decide-1")
    assert first.status_code == again.status_code == 200
    assert again["Idempotent-Replayed"] == "true"
    assert again.json() == first.json()
    assert Decision.objects.count() == 1
    assert Run.objects.filter(kind="resume").count() == 1


def test_the_same_key_with_another_body_is_409_and_another_caller_has_its_own():
    tenant = make_tenant()
    approval = waiting_request(tenant, amount="900.00")
    _, own = make_api_key(tenant, ["approvals"], user=make_member(tenant).user)
    _, other = make_api_key(tenant, ["approvals"], user=make_member(tenant).user)
    url = f"/api/v1/approvals/{approval.pk}/decision"
    body = {"approved": True}
    key = {"HTTP_IDEMPOTENCY_KEY": "decide-2"}
    assert api_client(own).post(url, body, format="json", **key).status_code == 200
    changed = api_client(own).post(
        url, {"approved": False, "note": "no"}, format="json", **key
    )
    assert changed.status_code == 409
    assert changed.json()["code"] == "idempotency_key_reused"
    # A second reviewer's key is their own: their decision is not a replay of
    # the first reviewer's.
    second = api_client(other).post(url, body, format="json", **key)
    assert second.status_code == 200 and "Idempotent-Replayed" not in second
    assert second.json()["status"] == "approved"
    assert Decision.objects.count() == 2


def _decided_with_key(key: str = "decide-3"):
    tenant = make_tenant()
    approval = waiting_request(tenant, amount="40.00")
    _, secret = make_api_key(tenant)
    client = api_client(secret)
    url = f"/api/v1/approvals/{approval.pk}/decision"
    body = {"approved": True, "note": "Customer Jane Roe, photo checked."}
    first = client.post(url, body, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert first.status_code == 200, first.content
    return tenant, approval, client, url, body


def _reads(tenant, how: str) -> int:
    return sum(
        1
        for event in AuditEvent.objects.filter(tenant=tenant, kind="approval.read")
        if event.data.get("how") == how
    )


def test_a_replayed_decision_is_an_audited_read_of_the_request():
    """The replay shows the payload and the note again: like the detail, it
    records `approval.read` (how "replay"), once per replay."""
    tenant, approval, client, url, body = _decided_with_key()
    assert _reads(tenant, "replay") == 0
    again = client.post(url, body, format="json", HTTP_IDEMPOTENCY_KEY="decide-3")
    assert again.status_code == 200 and again["Idempotent-Replayed"] == "true"
    assert again.json()["payload"]["args"]["amount"] == "40.00"
    assert _reads(tenant, "replay") == 1
    event = AuditEvent.objects.filter(tenant=tenant, kind="approval.read").last()
    assert event.data["approval_id"] == str(approval.pk)


def test_a_decision_replayed_after_its_threads_deletion_is_404_and_shredded():
    """The answer (payload, amount, the reviewer's note) was sealed under the
    master key ring: deleting the thread left it replayable for a day, with
    no audit event. Sealed under the thread's key, it is shredded with the
    thread; the replay answers 404, as the request itself now does, and its
    row is cleared when the thread's rows are removed."""
    tenant, approval, client, url, body = _decided_with_key()
    record = IdempotencyRecord.objects.get(tenant=tenant, key="decide-3")
    assert record.thread_id == approval.thread_id
    deleted = client.delete(f"/api/v1/threads/{approval.thread.thread_id}")
    assert deleted.status_code == 202, deleted.content
    reads = AuditEvent.objects.filter(tenant=tenant, kind="approval.read").count()

    again = client.post(url, body, format="json", HTTP_IDEMPOTENCY_KEY="decide-3")
    assert again.status_code == 404, again.content
    assert again.json()["code"] == "not_found"
    assert "Jane" not in again.content.decode()
    assert "Idempotent-Replayed" not in again
    assert (
        AuditEvent.objects.filter(tenant=tenant, kind="approval.read").count() == reads
    )
    # Nothing opens it any more: not the thread's key (destroyed), not the
    # master key ring.
    record.refresh_from_db()
    with pytest.raises(CryptoError):
        crypto.unseal(
            bytes(record.response_sealed),
            purpose="idempotent-response",
            context=(record.tenant_id, record.owner, record.key),
        )
    assert Decision.objects.count() == 1  # not decided a second time

    job_run("carry_out_deletions")
    record.refresh_from_db()
    assert record.response_sealed is None
