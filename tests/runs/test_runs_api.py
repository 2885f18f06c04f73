"""The runs API without execution: validation, tenancy, versions, deletion."""

import json
import threading

import pytest
from django.db import connection, transaction
from django.utils import timezone

from approvals.models import ApprovalRequest
from retention.models import DeletionRequest
from runs.models import Run, Thread
from tests.factories import tenant_with_client

pytestmark = pytest.mark.django_db


def assert_error(response, status, code):
    assert response.status_code == status, response.content
    assert response.json()["code"] == code
    return response.json()


def test_create_thread_with_generated_id():
    _, client = tenant_with_client()
    response = client.post("/api/v1/threads", {"agent": "refund"}, format="json")
    assert response.status_code == 201
    body = response.json()
    assert body["agent"] == "refund" and body["status"] == "idle"
    assert len(body["thread_id"]) == 32


def test_create_thread_twice_is_409():
    _, client = tenant_with_client()
    client.post(
        "/api/v1/threads", {"thread_id": "t1", "agent": "refund"}, format="json"
    )
    response = client.post(
        "/api/v1/threads", {"thread_id": "t1", "agent": "refund"}, format="json"
    )
    assert_error(response, 409, "thread_exists")


@pytest.mark.django_db(transaction=True)
def test_a_thread_created_twice_at_once_is_409_for_the_second():
    """The second insert waits for the first's transaction, then writes
    nothing: a 409, never a unique violation (a 500), and one event."""
    from audit.models import AuditEvent
    from audit.services import Actor
    from runs import services

    tenant, client = tenant_with_client()
    created, release = threading.Event(), threading.Event()

    def first():
        try:
            with transaction.atomic():
                services.thread_create(
                    tenant=tenant,
                    agent="refund",
                    actor=Actor.system("tests"),
                    thread_id="t-race",
                )
                created.set()
                release.wait(timeout=30)
        finally:
            connection.close()

    holder = threading.Thread(target=first)
    holder.start()
    assert created.wait(timeout=30)
    # Committed once the second waits on the first's row.
    threading.Timer(0.5, release.set).start()
    response = client.post(
        "/api/v1/threads", {"thread_id": "t-race", "agent": "refund"}, format="json"
    )
    holder.join(timeout=30)
    assert_error(response, 409, "thread_exists")
    assert Thread.objects.filter(thread_id="t-race").count() == 1
    assert (
        AuditEvent.objects.filter(kind="thread.created", thread_id="t-race").count()
        == 1
    )


def test_unknown_agent_is_400_naming_the_field():
    _, client = tenant_with_client()
    body = assert_error(
        client.post("/api/v1/threads", {"agent": "nope"}, format="json"), 400, "invalid"
    )
    assert "agent" in body["fields"]


def test_metadata_key_not_declared_safe_is_refused():
    _, client = tenant_with_client()
    response = client.post(
        "/api/v1/threads",
        {"agent": "refund", "metadata": {"email": "jane@example.com"}},
        format="json",
    )
    body = assert_error(response, 400, "invalid")
    assert "metadata" in body["fields"]


def test_subject_metadata_is_kept_only_as_a_blind_index():
    _, client = tenant_with_client()
    response = client.post(
        "/api/v1/threads",
        {
            "thread_id": "t1",
            "agent": "refund",
            "metadata": {"order_id": "A-1", "subject": "jane@example.com"},
        },
        format="json",
    )
    assert response.status_code == 201
    assert response.json()["metadata"] == {"order_id": "A-1"}
    thread = Thread.objects.get(thread_id="t1")
    assert "jane" not in json.dumps(thread.metadata) and len(thread.subject_hash) == 64


@pytest.mark.parametrize("bad_id", ["a/b", "", "x" * 256, "-leading"])
def test_bad_thread_id_is_400(bad_id):
    _, client = tenant_with_client()
    response = client.post(
        "/api/v1/threads", {"thread_id": bad_id, "agent": "refund"}, format="json"
    )
    assert_error(response, 400, "invalid")


@pytest.mark.parametrize(
    "body",
    [{"input": "text"}, {"input": [1, 2]}, {}, {"input": {}, "checkpoint_id": 5}],
)
def test_run_input_must_be_an_object(body):
    _, client = tenant_with_client()
    client.post(
        "/api/v1/threads", {"thread_id": "t1", "agent": "refund"}, format="json"
    )
    response = client.post("/api/v1/threads/t1/runs", body, format="json")
    assert_error(response, 400, "invalid")


def test_run_from_unknown_checkpoint_is_400():
    _, client = tenant_with_client()
    client.post(
        "/api/v1/threads", {"thread_id": "t1", "agent": "refund"}, format="json"
    )
    response = client.post(
        "/api/v1/threads/t1/runs", {"input": {}, "checkpoint_id": "nope"}, format="json"
    )
    assert_error(response, 400, "invalid")


def test_oversized_run_input_is_413(settings):
    settings.GATEHOUSE_MAX_BODY_BYTES = 2000
    _, client = tenant_with_client()
    client.post(
        "/api/v1/threads", {"thread_id": "t1", "agent": "refund"}, format="json"
    )
    response = client.post(
        "/api/v1/threads/t1/runs", {"input": {"x": "a" * 5000}}, format="json"
    )
    assert_error(response, 413, "payload_too_large")


def test_malformed_json_on_every_write_endpoint_is_400():
    _, client = tenant_with_client()
    client.post(
        "/api/v1/threads", {"thread_id": "t1", "agent": "refund"}, format="json"
    )
    for path in [
        "/api/v1/threads",
        "/api/v1/threads/t1/runs",
        "/api/v1/threads/t1/resume",
        "/api/v1/threads/t1/fork",
    ]:
        response = client.post(path, data="{oops", content_type="application/json")
        assert_error(response, 400, "parse_error")


def test_decision_on_missing_request_is_404():
    _, client = tenant_with_client()
    response = client.post(
        "/api/v1/approvals/00000000-0000-0000-0000-000000000000/decision",
        {"approved": True},
        format="json",
    )
    assert_error(response, 404, "not_found")
    assert_error(
        client.post("/api/v1/approvals/not-a-uuid/decision", {}, format="json"),
        404,
        "not_found",
    )


def test_unknown_thread_is_404_everywhere():
    _, client = tenant_with_client()
    for method, path in [
        ("get", "/api/v1/threads/ghost"),
        ("delete", "/api/v1/threads/ghost"),
        ("get", "/api/v1/threads/ghost/state"),
        ("get", "/api/v1/threads/ghost/history"),
        ("get", "/api/v1/threads/ghost/runs"),
        ("post", "/api/v1/threads/ghost/runs"),
        ("post", "/api/v1/threads/ghost/resume"),
        ("post", "/api/v1/threads/ghost/fork"),
    ]:
        response = getattr(client, method)(path, {}, format="json")
        assert_error(response, 404, "not_found")


def test_resume_of_idle_thread_is_409():
    _, client = tenant_with_client()
    client.post(
        "/api/v1/threads", {"thread_id": "t1", "agent": "refund"}, format="json"
    )
    response = client.post("/api/v1/threads/t1/resume", {"resume": 1}, format="json")
    assert_error(response, 409, "thread_not_interrupted")


def test_draining_version_refuses_new_threads(settings):
    settings.GATEHOUSE_AGENTS = "echo@1=tests.agents:echo_graph"
    settings.GATEHOUSE_DRAINING_AGENTS = ["echo@1"]
    _, client = tenant_with_client()
    client.post("/api/v1/threads", {"thread_id": "t1", "agent": "echo"}, format="json")
    response = client.post(
        "/api/v1/threads/t1/runs", {"input": {"text": "hi"}}, format="json"
    )
    assert_error(response, 409, "agent_draining")
    agents = client.get("/api/v1/agents").json()
    assert {"name": "echo", "version": "1", "draining": True}.items() <= next(
        a for a in agents if a["name"] == "echo"
    ).items()


def test_pinned_version_gone_is_version_skew(settings):
    tenant, client = tenant_with_client()
    client.post("/api/v1/threads", {"thread_id": "t1", "agent": "echo"}, format="json")
    thread = Thread.objects.get(thread_id="t1")
    Thread.objects.filter(pk=thread.pk).update(agent_version="9")
    response = client.post(
        "/api/v1/threads/t1/runs", {"input": {"text": "hi"}}, format="json"
    )
    body = assert_error(response, 409, "version_skew")
    assert "echo@9" in body["message"]
    assert not Run.objects.filter(thread=thread).exists()


def test_delete_thread_answers_202_then_404():
    _, client = tenant_with_client()
    client.post(
        "/api/v1/threads", {"thread_id": "t1", "agent": "refund"}, format="json"
    )
    response = client.delete("/api/v1/threads/t1")
    assert response.status_code == 202
    deletion = DeletionRequest.objects.get(pk=response.json()["deletion_request"])
    assert deletion.thread_ref == "t1"
    assert_error(client.get("/api/v1/threads/t1"), 404, "not_found")


def test_another_tenants_thread_is_404_and_untouched():
    _, client_a = tenant_with_client()
    _, client_b = tenant_with_client()
    client_a.post(
        "/api/v1/threads", {"thread_id": "t1", "agent": "refund"}, format="json"
    )
    for method, path in [
        ("get", "/api/v1/threads/t1"),
        ("delete", "/api/v1/threads/t1"),
        ("get", "/api/v1/threads/t1/state"),
        ("get", "/api/v1/threads/t1/history"),
        ("get", "/api/v1/threads/t1/runs"),
        ("post", "/api/v1/threads/t1/runs"),
        ("post", "/api/v1/threads/t1/resume"),
        ("post", "/api/v1/threads/t1/fork"),
    ]:
        response = getattr(client_b, method)(path, {"input": {}}, format="json")
        assert_error(response, 404, "not_found")
    assert client_b.get("/api/v1/threads").json()["results"] == []
    assert client_a.get("/api/v1/threads/t1").json()["status"] == "idle"
    assert not DeletionRequest.objects.exists() and not Run.objects.exists()


def _open_request_for(tenant) -> ApprovalRequest:
    """A pending approval request of `tenant`, opened as an interrupted run would."""
    from langgraph.types import Interrupt

    from approvals.services import approval_requests_open
    from audit.services import Actor
    from runs import services

    thread = services.thread_create(
        tenant=tenant, agent="gate", actor=Actor.system("t")
    )
    Thread.objects.filter(pk=thread.pk).update(agent_version="1", status="interrupted")
    run = Run.objects.create(
        tenant=tenant,
        thread=thread,
        kind="start",
        agent_version="1",
        status="interrupted",
    )
    payload = {
        "action": "do_it",
        "args": {"x": 1},
        "reason": "r",
        "affects": "a",
        "if_denied": "d",
    }
    (request,) = approval_requests_open(
        run=run, interrupts=[Interrupt(value=payload, id="interrupt-1")]
    )
    return request


def test_another_tenants_approval_is_404_and_undecided():
    tenant_a, client_a = tenant_with_client()
    _, client_b = tenant_with_client()
    request = _open_request_for(tenant_a)
    assert client_a.get(f"/api/v1/approvals/{request.id}").status_code == 200
    assert_error(client_b.get(f"/api/v1/approvals/{request.id}"), 404, "not_found")
    response = client_b.post(
        f"/api/v1/approvals/{request.id}/decision", {"approved": True}, format="json"
    )
    assert_error(response, 404, "not_found")
    assert client_b.get("/api/v1/approvals").json()["results"] == []
    request.refresh_from_db()
    assert request.status == "pending" and not request.decisions.exists()


def test_deny_without_note_is_rejected():
    tenant, client = tenant_with_client()
    request = _open_request_for(tenant)
    response = client.post(
        f"/api/v1/approvals/{request.id}/decision", {"approved": False}, format="json"
    )
    body = assert_error(response, 400, "invalid")
    assert "note" in body["fields"]
    request.refresh_from_db()
    assert request.status == "pending"


@pytest.mark.parametrize(
    "body", [{}, {"approved": "maybe"}, {"approved": True, "args": []}]
)
def test_malformed_decision_is_400(body):
    tenant, client = tenant_with_client()
    request = _open_request_for(tenant)
    response = client.post(
        f"/api/v1/approvals/{request.id}/decision", body, format="json"
    )
    assert_error(response, 400, "invalid")


def test_approval_list_filters_are_validated():
    _, client = tenant_with_client()
    assert_error(client.get("/api/v1/approvals?risk=extreme"), 400, "invalid")
    assert client.get("/api/v1/approvals?risk=high&status=pending").status_code == 200


def test_approval_payload_is_ciphertext_at_rest():
    tenant, _ = tenant_with_client()
    request = _open_request_for(tenant)
    raw = bytes(
        ApprovalRequest.objects.values_list("payload", flat=True).get(pk=request.pk)
    )
    assert b"do_it" not in raw and b"affects" not in raw


def test_idempotent_run_start_returns_the_same_run():
    _, client = tenant_with_client()
    client.post("/api/v1/threads", {"thread_id": "t1", "agent": "echo"}, format="json")
    body = {"input": {"text": "hi"}}
    first = client.post(
        "/api/v1/threads/t1/runs", body, format="json", HTTP_IDEMPOTENCY_KEY="start-t1"
    )
    again = client.post(
        "/api/v1/threads/t1/runs", body, format="json", HTTP_IDEMPOTENCY_KEY="start-t1"
    )
    assert first.status_code == again.status_code == 202
    assert again.json() == first.json() and again["Idempotent-Replayed"] == "true"
    assert Run.objects.filter(thread__thread_id="t1").count() == 1


def test_a_retried_decision_with_its_key_replays_the_first_answer():
    tenant, client = tenant_with_client()
    request = _open_request_for(tenant)
    url = f"/api/v1/approvals/{request.id}/decision"
    body = {"approved": True, "note": "checked"}

    first = client.post(url, body, format="json", HTTP_IDEMPOTENCY_KEY="decide-1")
    again = client.post(url, body, format="json", HTTP_IDEMPOTENCY_KEY="decide-1")

    assert first.status_code == again.status_code == 200
    assert again.json() == first.json() and again["Idempotent-Replayed"] == "true"
    assert request.decisions.count() == 1


def test_approvals_of_a_deleted_thread_answer_404():
    tenant, client = tenant_with_client()
    request = _open_request_for(tenant)
    assert (
        client.delete(f"/api/v1/threads/{request.thread.thread_id}").status_code == 202
    )
    assert_error(client.get(f"/api/v1/approvals/{request.id}"), 404, "not_found")
    response = client.post(
        f"/api/v1/approvals/{request.id}/decision", {"approved": True}, format="json"
    )
    assert_error(response, 404, "not_found")
    assert client.get("/api/v1/approvals").json()["results"] == []


def test_a_bad_list_filter_names_the_parameter_and_the_values_allowed():
    _, client = tenant_with_client()
    body = assert_error(client.get("/api/v1/threads?status=asleep"), 400, "invalid")
    assert body["fields"] == {
        "status": ["must be one of idle, running, interrupted, error"]
    }


def test_a_run_is_found_only_through_its_live_thread_of_the_callers_tenant():
    tenant_a, client_a = tenant_with_client()
    _, client_b = tenant_with_client()
    for thread_id in ("t1", "t2"):
        client_a.post(
            "/api/v1/threads",
            {"thread_id": thread_id, "agent": "refund"},
            format="json",
        )
    thread = Thread.objects.get(tenant=tenant_a, thread_id="t1")
    run = Run.objects.create(
        tenant=tenant_a, thread=thread, agent_version=thread.agent_version
    )
    assert client_a.get(f"/api/v1/threads/t1/runs/{run.pk}").status_code == 200
    for client, path in [
        (client_b, f"/api/v1/threads/t1/runs/{run.pk}"),  # another tenant
        (client_a, f"/api/v1/threads/t2/runs/{run.pk}"),  # another thread
    ]:
        assert_error(client.get(path), 404, "not_found")
    Thread.objects.filter(pk=thread.pk).update(deleted_at=timezone.now())
    assert_error(client_a.get(f"/api/v1/threads/t1/runs/{run.pk}"), 404, "not_found")
