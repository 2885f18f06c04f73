"""History, state at a checkpoint, fork, and a run from a named checkpoint."""

import json

import pytest

from audit.models import AuditEvent
from runs.models import Run
from tests.factories import tenant_with_client
from tests.workers import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]




def run_and_wait(client, body):
    run_id = client.post("/api/v1/threads/t1/runs", body, format="json").json()["run_id"]
    wait_for(lambda: Run.objects.get(pk=run_id).status == "succeeded",
             what="the run to succeed")
    return run_id


def test_fork_with_changed_values_and_continue_from_it(worker):
    tenant, client = tenant_with_client()
    client.post("/api/v1/threads", {"thread_id": "t1", "agent": "echo"}, format="json")
    run_and_wait(client, {"input": {"text": "hello"}})
    assert client.get("/api/v1/threads/t1/state").json()["values"]["echoed"] == "hello"

    history = client.get("/api/v1/threads/t1/history").json()["results"]
    assert [entry["step"] for entry in history] == sorted(
        (entry["step"] for entry in history), reverse=True
    )
    # The checkpoint where the input was written and "echo" is next.
    before_echo = next(entry for entry in history if entry["next"] == ["echo"])
    old = client.get(f"/api/v1/threads/t1/state/{before_echo['checkpoint_id']}").json()
    assert old["values"] == {"text": "hello"} and old["next"] == ["echo"]

    forked = client.post(
        "/api/v1/threads/t1/fork",
        {"checkpoint_id": before_echo["checkpoint_id"], "values": {"text": "changed"}},
        format="json",
    )
    assert forked.status_code == 201, forked.content
    branch = forked.json()["checkpoint_id"]
    branch_state = client.get(f"/api/v1/threads/t1/state/{branch}").json()
    assert branch_state["parent_checkpoint_id"] == before_echo["checkpoint_id"]
    assert branch_state["values"]["text"] == "changed"

    run_id = run_and_wait(client, {"input": {}, "checkpoint_id": branch})
    assert Run.objects.get(pk=run_id).kind == "replay"
    assert client.get("/api/v1/threads/t1/state").json()["values"]["echoed"] == "changed"
    kinds = set(AuditEvent.objects.for_tenant(tenant).values_list("kind", flat=True))
    assert {"thread.forked", "thread.state_read"} <= kinds


def test_fork_from_unknown_checkpoint_is_400(worker):
    _, client = tenant_with_client()
    client.post("/api/v1/threads", {"thread_id": "t1", "agent": "echo"}, format="json")
    run_and_wait(client, {"input": {"text": "hello"}})
    response = client.post("/api/v1/threads/t1/fork",
                           {"checkpoint_id": "nope", "values": {}}, format="json")
    assert response.status_code == 400 and "checkpoint_id" in response.json()["fields"]
    assert client.get("/api/v1/threads/t1/state/nope").status_code == 404


def test_history_pages_with_before(worker):
    _, client = tenant_with_client()
    client.post("/api/v1/threads", {"thread_id": "t1", "agent": "echo"}, format="json")
    run_and_wait(client, {"input": {"text": "hello"}})
    everything = client.get("/api/v1/threads/t1/history").json()["results"]
    first = client.get("/api/v1/threads/t1/history?limit=2").json()
    assert len(first["results"]) == 2 and first["next"]
    second = client.get(first["next"]).json()
    ids = [entry["checkpoint_id"] for entry in first["results"] + second["results"]]
    assert ids == [entry["checkpoint_id"] for entry in everything][: len(ids)]
    assert client.get("/api/v1/threads/t1/history?limit=0").status_code == 400


# Ids no checkpoint can have (runs.models.checkpoints.compact_id refuses them):
# a NUL, a lone surrogate, longer than 255 characters, not text at all.
UNSTORABLE_IDS = ["ab\x00cd", "\ud800", "x" * 256]


def test_a_checkpoint_id_no_checkpoint_can_have_is_4xx_on_every_path(worker):
    """Not a 500 (issue 16): state at it is 404, as any unknown checkpoint;
    history `before` it, a fork or a run from it, 400 naming the field."""
    _, client = tenant_with_client()
    client.post("/api/v1/threads", {"thread_id": "t1", "agent": "echo"}, format="json")
    run_and_wait(client, {"input": {"text": "hello"}})

    def error(response, *statuses):
        assert response.status_code in statuses, response.content
        assert {"code", "message"} <= set(response.json()), response.content
        return response.json()

    def post(path, body):
        # json.dumps escapes a lone surrogate ("\ud800"), as a client's JSON may.
        return client.post(path, json.dumps(body), content_type="application/json")

    # (A URL's or query string's invalid UTF-8 reaches views replaced, never as
    # a lone surrogate; JSON's "\ud800" does.)
    for bad in ["ab%00cd", "x" * 256]:
        error(client.get(f"/api/v1/threads/t1/state/{bad}"), 404)
        error(client.get(f"/langgraph/threads/t1/state/{bad}"), 404)
        assert "before" in error(
            client.get(f"/api/v1/threads/t1/history?before={bad}"), 400
        )["fields"]
    for bad in UNSTORABLE_IDS:
        for before in (bad, {"checkpoint_id": bad}):
            error(post("/langgraph/threads/t1/history", {"before": before}), 400)
        # 400 where the body's serializer refuses it first (DRF: no NUL).
        error(post("/langgraph/threads/t1/state/checkpoint",
                   {"checkpoint": {"checkpoint_id": bad}}),
              400, 404)
        for path, body in [
            ("/langgraph/threads/t1/state", {"values": {}, "checkpoint_id": bad}),
            ("/langgraph/threads/t1/state",
             {"values": {}, "checkpoint": {"checkpoint_id": bad}}),
            ("/langgraph/threads/t1/runs",
             {"assistant_id": "echo", "input": {}, "checkpoint_id": bad}),
            ("/api/v1/threads/t1/fork", {"checkpoint_id": bad, "values": {}}),
            ("/api/v1/threads/t1/runs", {"input": {}, "checkpoint_id": bad}),
        ]:
            error(post(path, body), 400)
    error(post("/langgraph/threads/t1/history", {"before": {"checkpoint_id": 5}}), 400)
