"""Assistants and threads through the official langgraph-sdk; what the SDK
calls that Gatehouse refuses, it refuses clearly."""

from __future__ import annotations

import httpx
import pytest
from langgraph_sdk.errors import APIStatusError, BadRequestError, NotFoundError

from audit.models import AuditEvent
from retention.models import DeletionRequest
from runs.models import Thread
from tests.workers import wait_for

pytestmark = pytest.mark.worker


def test_assistants_are_the_registered_agent_versions(sdk):
    client = sdk()
    assistants = client.assistants.search(limit=100)
    names = {assistant["name"] for assistant in assistants}
    assert {"refund@1", "echo@1", "echo@2", "chat@1"} <= names
    [echo2] = client.assistants.search(graph_id="echo", metadata={"agent_version": "2"})
    assert echo2["graph_id"] == "echo" and echo2["version"] == 2
    assert client.assistants.get(echo2["assistant_id"]) == echo2
    # A graph's name stands for its newest version, as LangGraph clients use it.
    assert client.assistants.get("echo")["assistant_id"] == echo2["assistant_id"]
    graph = client.assistants.get_graph("chat")
    assert {"ask_name", "greet"} <= {node["id"] for node in graph["nodes"]}
    assert client.assistants.get_schemas("chat")["graph_id"] == "chat"


def test_assistants_are_not_created_over_the_api(sdk):
    client = sdk()
    with pytest.raises(APIStatusError) as refused:
        client.assistants.create("chat", config={"configurable": {"x": 1}})
    assert refused.value.status_code == 405
    assert refused.value.body["code"] == "not_supported"


def test_thread_create_get_update_and_search_by_metadata(sdk):
    client = sdk()
    created = client.threads.create(
        thread_id="case-1", metadata={"graph_id": "chat", "channel": "web"}
    )
    assert created["status"] == "idle"
    assert created["metadata"]["graph_id"] == "chat"
    client.threads.create(metadata={"graph_id": "chat", "channel": "phone"})
    client.threads.create(metadata={"graph_id": "echo"})
    client.threads.update("case-1", metadata={"topic": "billing"})
    assert client.threads.get("case-1")["metadata"]["topic"] == "billing"
    found = client.threads.search(metadata={"channel": "web"})
    assert [thread["thread_id"] for thread in found] == ["case-1"]
    assert len(client.threads.search(metadata={"graph_id": "chat"})) == 2
    assert client.threads.count(metadata={"graph_id": "echo"}) == 1
    assert len(client.threads.search(status="idle", limit=2, offset=1)) == 2


def test_thread_create_if_exists(sdk):
    client = sdk()
    client.threads.create(thread_id="twice")
    assert (
        client.threads.create(thread_id="twice", if_exists="do_nothing")["thread_id"]
        == "twice"
    )
    with pytest.raises(APIStatusError) as refused:
        client.threads.create(thread_id="twice")
    assert refused.value.status_code == 409


def test_a_search_by_a_metadata_key_ending_in_a_newline_is_refused(sdk):
    """The key is matched whole: "channel\\n" passed a `^...$` matched with
    re.match ("$" matches before a final newline)."""
    client = sdk()
    with pytest.raises(BadRequestError) as refused:
        client.threads.search(metadata={"channel\n": "web"})
    assert "metadata" in refused.value.body["fields"]


def test_metadata_the_agent_does_not_declare_safe_is_refused(sdk):
    client = sdk()
    with pytest.raises(BadRequestError) as refused:
        client.threads.create(metadata={"graph_id": "chat", "email": "a@b.c"})
    assert "metadata" in refused.value.body["fields"]


def test_thread_delete_is_the_crypto_shredding_deletion(sdk):
    client = sdk()
    thread_id = client.threads.create(metadata={"graph_id": "echo"})["thread_id"]
    client.runs.wait(thread_id, "echo", input={"text": "secret"})
    client.threads.delete(thread_id)
    with pytest.raises(NotFoundError):
        client.threads.get(thread_id)
    thread = Thread.objects.get(thread_id=thread_id)
    assert thread.deleted_at is not None and thread.wrapped_data_key is None
    # The worker removes the rows; the test waits for it before the flush.
    wait_for(
        lambda: DeletionRequest.objects.filter(
            tenant=client.tenant, status=DeletionRequest.Status.COMPLETED
        ).exists(),
        what="the deletion to complete",
    )


def test_thread_copy_has_the_same_state_under_its_own_key(sdk):
    client = sdk()
    thread_id = client.threads.create(metadata={"graph_id": "echo"})["thread_id"]
    client.runs.wait(thread_id, "echo", input={"text": "copied"})
    copy = client.threads.copy(thread_id)
    assert copy["thread_id"] != thread_id
    assert copy["values"] == {"text": "copied", "echoed": "copied"}
    source, target = Thread.objects.filter(thread_id__in=[thread_id, copy["thread_id"]])
    assert bytes(source.wrapped_data_key) != bytes(target.wrapped_data_key)


def test_state_and_history_are_read_and_audited(sdk):
    client = sdk()
    thread_id = client.threads.create(metadata={"graph_id": "echo"})["thread_id"]
    client.runs.wait(thread_id, "echo", input={"text": "one"})
    client.runs.wait(thread_id, "echo", input={"text": "two"})
    state = client.threads.get_state(thread_id)
    assert state["values"]["echoed"] == "two" and state["next"] == []
    history = client.threads.get_history(thread_id, limit=20)
    assert history[0]["checkpoint"] == state["checkpoint"]
    assert {entry["values"].get("text") for entry in history} >= {"one", "two"}
    earlier = client.threads.get_state(
        thread_id, checkpoint_id=history[-1]["checkpoint"]["checkpoint_id"]
    )
    assert earlier["checkpoint"] == history[-1]["checkpoint"]
    kinds = set(
        AuditEvent.objects.filter(
            tenant=client.tenant, thread_id=thread_id
        ).values_list("kind", flat=True)
    )
    assert {"thread.state_read", "thread.history_read", "run.output_read"} <= kinds


def test_values_filter_is_refused_because_state_is_encrypted(sdk):
    client = sdk()
    with pytest.raises(BadRequestError) as refused:
        client.threads.search(values={"text": "x"})
    assert "values" in refused.value.body["fields"]


def _sdk_calls_that_are_refused(client, thread_id):
    yield lambda: client.store.put_item(["a"], "k", {"v": 1})
    yield lambda: client.store.get_item(["a"], "k")
    yield lambda: client.store.search_items(["a"])
    yield lambda: client.store.list_namespaces()
    yield lambda: client.store.delete_item(["a"], "k")
    yield lambda: client.crons.create("echo", schedule="* * * * *")
    yield lambda: client.crons.create_for_thread(
        thread_id, "echo", schedule="* * * * *"
    )
    yield lambda: client.crons.search()
    yield lambda: client.crons.count()
    yield lambda: client.crons.delete("c1")
    yield lambda: client.runs.wait(None, "echo", input={"text": "x"})
    yield lambda: client.runs.create(None, "echo", input={"text": "x"})
    yield lambda: list(client.runs.stream(None, "echo", input={"text": "x"}))
    yield lambda: client.runs.create_batch([{"assistant_id": "echo"}])
    yield lambda: client.threads.prune([thread_id])
    yield lambda: list(client.threads.join_stream(thread_id))
    yield lambda: client.assistants.update("echo", metadata={"a": 1})
    yield lambda: client.assistants.delete("echo")
    yield lambda: client.assistants.set_latest("echo", 1)


def test_what_the_sdk_calls_is_refused_clearly_never_a_bare_404_or_500(sdk):
    client = sdk()
    thread_id = client.threads.create()["thread_id"]
    for call in _sdk_calls_that_are_refused(client, thread_id):
        with pytest.raises(httpx.HTTPStatusError) as refused:
            call()
        response = refused.value.response
        assert response.status_code == 405, response.request.url
        assert response.json()["code"] == "not_supported"
        assert response.json()["message"]
