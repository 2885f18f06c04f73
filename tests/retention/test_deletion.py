"""Deletion requests: by thread and by data subject; holds; the record."""

import pytest

from approvals.models import ApprovalRequest
from audit.models import AuditEvent
from retention.jobs import job_run
from retention.models import DeletionRequest, ThreadRemoval
from retention.services import (
    legal_hold_lift,
    legal_hold_place,
    subject_deletion_request,
    thread_deletion_request,
)
from runs.checkpointer import DjangoSaver
from runs.crypto import ThreadDeleted
from runs.models import Checkpoint, Run, Thread, ToolCall
from tests.factories import (
    api_client,
    make_api_key,
    make_member,
    make_tenant,
    stored_cipher,
)
from tests.retention.helpers import (
    SECRET,
    TESTS,
    content_rows,
    make_thread,
    tables_containing,
)

pytestmark = pytest.mark.django_db

SUBJECT = "jane.doe@example.com"


def carry_out():
    return job_run("carry_out_deletions", batch_size=2)


def test_a_subject_deletion_removes_every_thread_of_the_subject():
    tenant, other_tenant = make_tenant(), make_tenant()
    theirs = [make_thread(tenant, f"jane-{n}", subject=SUBJECT) for n in range(3)]
    bystander = make_thread(tenant, "john", subject="john@example.com")
    elsewhere = make_thread(other_tenant, "jane-0", subject=SUBJECT)
    # A copy of a ciphertext taken before the deletion (a backup, say).
    saved = Checkpoint.objects.filter(thread=theirs[0]).first()
    copied = (bytes(saved.checkpoint), ("checkpoint", "", saved.checkpoint_id))

    assert "runs_thread" in tables_containing("jane-1")  # the check sees clear text
    request = subject_deletion_request(
        tenant=tenant, subject="  Jane.Doe@Example.com ", actor=TESTS
    )

    # Keys are destroyed at once: nothing of those threads can be read any more.
    assert request.status == "shredded" and request.record["threads_found"] == 3
    for thread in theirs:
        with pytest.raises(ThreadDeleted):
            stored_cipher(thread.pk)
    with pytest.raises(ThreadDeleted):
        stored_cipher(theirs[0].pk).decrypt(copied[0], row=copied[1])
    assert not Thread.objects.for_tenant(tenant).filter(thread_id="jane-1").exists()

    report = carry_out()
    assert report.totals["threads_removed"] == 3
    request.refresh_from_db()
    assert request.status == "completed" and request.completed_at is not None
    record = request.record
    assert record["threads_removed"] == 3
    assert sorted(record["threads"]) == ["jane-0", "jane-1", "jane-2"]
    assert record["removed"]["checkpoints"] == 9
    assert record["removed"]["run_contents"] == 3
    assert record["removed"]["tool_results"] == 3
    assert record["removed"]["approval_payloads"] == 3
    for thread in theirs:
        assert content_rows(thread) == {
            "checkpoints": 0,
            "channel_blobs": 0,
            "pending_writes": 0,
        }
        assert Run.objects.get(thread=thread).input is None
        assert ToolCall.objects.get(thread=thread).result is None
        approval = ApprovalRequest.objects.get(thread=thread)
        assert approval.status == "cancelled" and bytes(approval.payload) == b""
        assert Thread.objects.get(pk=thread.pk).subject_hash == ""
    # What is left of the subject's threads: no plaintext, no ciphertext.
    assert tables_containing(SECRET) == []
    assert tables_containing("jane.doe") == []
    # Others untouched and readable.
    for thread in (bystander, elsewhere):
        assert content_rows(thread)["checkpoints"] == 3
        saver = DjangoSaver(tenant=thread.tenant)
        config = {"configurable": {"thread_id": thread.thread_id}}
        assert (
            SECRET
            in saver.get_tuple(config).checkpoint["channel_values"]["messages"][0]
        )
    # The audit trail keeps the threads' events and their tombstones.
    tombstones = AuditEvent.objects.for_tenant(tenant).filter(kind="thread.deleted")
    assert sorted(tombstones.values_list("thread_id", flat=True)) == [
        "jane-0",
        "jane-1",
        "jane-2",
    ]
    assert all(t.data["deletion_request"] == str(request.pk) for t in tombstones)
    assert (
        AuditEvent.objects.for_tenant(tenant)
        .filter(kind="thread.created", thread_id="jane-1")
        .exists()
    )
    assert (
        AuditEvent.objects.for_tenant(tenant).filter(kind="deletion.completed").exists()
    )
    # Carrying out again changes nothing and records nothing twice.
    assert carry_out().totals == {}
    assert ThreadRemoval.objects.filter(deletion_request=request).count() == 3


def test_a_deletion_request_for_a_held_thread_waits_until_the_hold_is_lifted():
    tenant = make_tenant()
    thread = make_thread(tenant, "case-1")
    hold = legal_hold_place(tenant=tenant, thread=thread, reason="audit", actor=TESTS)

    request = thread_deletion_request(thread=thread, actor=TESTS)
    assert request.status == "on_hold"
    carry_out()
    request.refresh_from_db()
    assert request.status == "on_hold"
    stored_cipher(thread.pk)  # untouched
    assert content_rows(thread)["checkpoints"] == 3

    legal_hold_lift(hold=hold, actor=TESTS)
    carry_out()
    request.refresh_from_db()
    assert request.status == "completed"
    assert request.record["threads"] == ["case-1"]
    assert content_rows(thread)["checkpoints"] == 0
    with pytest.raises(ThreadDeleted):
        stored_cipher(thread.pk)


def test_a_subject_request_removes_what_it_may_and_waits_for_the_held_rest():
    tenant = make_tenant()
    free = make_thread(tenant, "a", subject=SUBJECT)
    held = make_thread(tenant, "b", subject=SUBJECT)
    legal_hold_place(tenant=tenant, thread=held, reason="matter", actor=TESTS)
    request = subject_deletion_request(tenant=tenant, subject=SUBJECT, actor=TESTS)
    assert request.status == "on_hold"
    carry_out()
    request.refresh_from_db()
    assert request.status == "on_hold"
    assert request.record["threads"] == ["a"]
    assert request.record["threads_on_hold"] == 1
    assert content_rows(free)["checkpoints"] == 0
    assert content_rows(held)["checkpoints"] == 3


def test_the_api_accepts_a_subject_deletion_and_shows_its_status_and_record():
    tenant = make_tenant()
    _, secret = make_api_key(tenant, ["runs"])
    client = api_client(secret)
    make_thread(tenant, "jane-1", subject=SUBJECT)

    response = client.post(
        "/api/v1/deletion-requests", {"subject": SUBJECT}, format="json"
    )
    assert response.status_code == 202, response.content
    body = response.json()
    assert body["kind"] == "subject" and body["status"] == "shredded"
    assert SUBJECT not in response.content.decode()
    carry_out()
    shown = client.get(f"/api/v1/deletion-requests/{body['id']}").json()
    assert shown["status"] == "completed"
    assert shown["record"]["threads"] == ["jane-1"]
    assert shown["record"]["removed"]["checkpoints"] == 3
    assert shown["completed_at"]

    _, other_secret = make_api_key(make_tenant())
    other = api_client(other_secret).get(f"/api/v1/deletion-requests/{body['id']}")
    assert other.status_code == 404


def test_the_api_refuses_bad_deletion_requests():
    tenant = make_tenant()
    _, secret = make_api_key(tenant, ["runs"])
    client = api_client(secret)
    both = client.post(
        "/api/v1/deletion-requests",
        {"subject": SUBJECT, "thread_id": "x"},
        format="json",
    )
    assert both.status_code == 400 and both.json()["code"] == "invalid"
    missing = client.post("/api/v1/deletion-requests", {}, format="json")
    assert missing.status_code == 400
    ghost = client.post(
        "/api/v1/deletion-requests", {"thread_id": "ghost"}, format="json"
    )
    assert ghost.status_code == 404
    _, audit_secret = make_api_key(tenant, ["audit"])
    refused = api_client(audit_secret).post(
        "/api/v1/deletion-requests", {"subject": SUBJECT}, format="json"
    )
    assert refused.status_code == 403
    assert not DeletionRequest.objects.exists()


def test_a_compliance_officer_may_ask_and_a_reviewer_may_not():
    tenant = make_tenant()
    officer = make_member(tenant, role="compliance_officer")
    reviewer = make_member(tenant, role="reviewer")
    for membership, expected in ((officer, 202), (reviewer, 403)):
        client = api_client()
        client.force_login(membership.user)
        response = client.post(
            "/api/v1/deletion-requests", {"subject": SUBJECT}, format="json"
        )
        assert response.status_code == expected, response.content


def test_deleting_a_thread_through_the_api_then_carrying_it_out():
    tenant = make_tenant()
    _, secret = make_api_key(tenant, ["runs"])
    client = api_client(secret)
    thread = make_thread(tenant, "case-5")
    response = client.delete("/api/v1/threads/case-5")
    assert response.status_code == 202
    assert client.get("/api/v1/threads/case-5").status_code == 404
    carry_out()
    request = DeletionRequest.objects.get(pk=response.json()["deletion_request"])
    assert request.status == "completed"
    assert content_rows(thread)["checkpoints"] == 0
