"""The Agent Protocol API sees through the caller's tenant, like /api/v1:
another tenant's key gets a 404 on everything, a key without the scope a 403,
no key a 401."""

from __future__ import annotations

import httpx
import pytest
from langgraph_sdk import get_sync_client

from runs.models import Run

pytestmark = pytest.mark.worker


def _calls_on(client, thread_id: str, run_id: str):
    """Every SDK call that names a thread or a run."""
    checkpoint_id = "1f1ecd43-c364-6b0c-8002-240fabd38149"
    yield "threads.get", lambda: client.threads.get(thread_id)
    yield "threads.update", lambda: client.threads.update(thread_id, metadata={})
    yield "threads.delete", lambda: client.threads.delete(thread_id)
    yield "threads.copy", lambda: client.threads.copy(thread_id)
    yield "threads.get_state", lambda: client.threads.get_state(thread_id)
    yield (
        "threads.get_state(checkpoint_id)",
        lambda: client.threads.get_state(thread_id, checkpoint_id=checkpoint_id),
    )
    yield (
        "threads.update_state",
        lambda: client.threads.update_state(thread_id, {"text": "x"}),
    )
    yield "threads.get_history", lambda: client.threads.get_history(thread_id)
    yield "runs.list", lambda: client.runs.list(thread_id)
    yield "runs.create", lambda: client.runs.create(thread_id, "echo", input={})
    yield "runs.wait", lambda: client.runs.wait(thread_id, "echo", input={})
    yield "runs.stream", lambda: list(client.runs.stream(thread_id, "echo", input={}))
    yield "runs.get", lambda: client.runs.get(thread_id, run_id)
    yield "runs.join", lambda: client.runs.join(thread_id, run_id)
    yield "runs.join_stream", lambda: list(client.runs.join_stream(thread_id, run_id))
    yield "runs.cancel", lambda: client.runs.cancel(thread_id, run_id)
    yield "runs.cancel_many", lambda: client.runs.cancel_many(run_ids=[run_id])


def _status_of(call) -> int:
    with pytest.raises(httpx.HTTPStatusError) as refused:
        call()
    return refused.value.response.status_code


def test_another_tenants_key_gets_404_on_every_thread_and_run(sdk):
    owner = sdk()
    thread_id = owner.threads.create(metadata={"graph_id": "echo"})["thread_id"]
    run = owner.runs.create(thread_id, "echo", input={"text": "mine"})
    owner.runs.join(thread_id, run["run_id"])
    stranger = sdk()
    statuses = {
        name: _status_of(call)
        for name, call in _calls_on(stranger, thread_id, run["run_id"])
    }
    assert statuses == {name: 404 for name in statuses}
    assert stranger.threads.search() == []
    assert stranger.threads.count() == 0
    # Nothing of the owner's changed.
    assert owner.threads.get(thread_id)["values"]["echoed"] == "mine"
    assert Run.objects.filter(thread__thread_id=thread_id).count() == 1


def test_a_key_without_the_runs_scope_is_refused(sdk):
    client = sdk(scopes=["approvals"])
    with pytest.raises(httpx.HTTPStatusError) as refused:
        client.threads.create()
    assert refused.value.response.status_code == 403


def test_no_key_and_a_wrong_key_are_401(gatehouse_server, transactional_db):
    for api_key in (None, "gh_nothere.secret"):
        client = get_sync_client(
            url=f"{gatehouse_server.url}/langgraph", api_key=api_key
        )
        with pytest.raises(httpx.HTTPStatusError) as refused:
            client.threads.search()
        assert refused.value.response.status_code == 401
        client.http.client.close()


def test_the_key_is_read_from_the_bearer_header_too(sdk, gatehouse_server):
    keyed = sdk()
    secret = keyed.http.client.headers["x-api-key"]
    response = httpx.post(
        f"{gatehouse_server.url}/langgraph/threads/search",
        json={},
        headers={"Authorization": f"Bearer {secret}"},
    )
    assert response.status_code == 200 and response.json() == []


def test_ok_and_info_answer_without_a_key(gatehouse_server, transactional_db):
    assert httpx.get(f"{gatehouse_server.url}/langgraph/ok").json() == {"ok": True}
    info = httpx.get(f"{gatehouse_server.url}/langgraph/info").json()
    assert info["flags"]["assistants"] is True
