"""Runs through the official langgraph-sdk: background, wait, join, stream,
rejoin, resume of an input interrupt, cancel, multitask strategies."""

from __future__ import annotations

import pytest
from langgraph_sdk.errors import BadRequestError, ConflictError

from runs.models import Run, Thread
from tests.workers import wait_for

pytestmark = pytest.mark.worker

HELLO = {"messages": [{"role": "user", "content": "hi"}]}


def chat_thread(client) -> str:
    return client.threads.create(metadata={"graph_id": "chat"})["thread_id"]


def interrupted_chat(client) -> str:
    thread_id = chat_thread(client)
    client.runs.wait(thread_id, "chat", input=HELLO)
    return thread_id


def test_run_created_in_the_background_is_joined_with_its_final_values(sdk):
    client = sdk()
    thread_id = client.threads.create(metadata={"graph_id": "echo"})["thread_id"]
    run = client.runs.create(thread_id, "echo", input={"text": "ping"})
    assert run["status"] in ("pending", "running")
    assert client.runs.join(thread_id, run["run_id"]) == {
        "text": "ping",
        "echoed": "ping",
    }
    assert client.runs.get(thread_id, run["run_id"])["status"] == "success"


def test_wait_answers_the_values_and_the_interrupt_it_stopped_on(sdk):
    client = sdk()
    thread_id = chat_thread(client)
    output = client.runs.wait(thread_id, "chat", input=HELLO)
    assert output["messages"][0]["content"] == "hi"
    [interrupt] = output["__interrupt__"]
    assert interrupt["value"] == {"question": "What is your name?"}
    thread = client.threads.get(thread_id)
    assert thread["status"] == "interrupted"
    assert [i["id"] for i in sum(thread["interrupts"].values(), [])] == [
        interrupt["id"]
    ]


def test_input_interrupt_is_resumed_with_a_command(sdk):
    client = sdk()
    thread_id = interrupted_chat(client)
    output = client.runs.wait(thread_id, "chat", command={"resume": "Ada"})
    assert output["name"] == "Ada"
    assert output["messages"][-1]["content"] == "Hello Ada, nice to meet you."
    assert client.threads.get(thread_id)["status"] == "idle"


def test_stream_delivers_values_updates_and_tokens_while_the_worker_runs(sdk):
    client = sdk()
    thread_id = interrupted_chat(client)
    seen = []
    run_id = status_at_first_token = None
    for part in client.runs.stream(
        thread_id,
        "chat",
        command={"resume": "Ada"},
        stream_mode=["values", "updates", "messages-tuple", "custom"],
    ):
        seen.append(part.event)
        if part.event == "metadata":
            run_id = part.data["run_id"]
        if part.event == "messages" and status_at_first_token is None:
            status_at_first_token = client.runs.get(thread_id, run_id)["status"]
    assert seen[0] == "metadata" and seen[-1] == "end"
    assert {"values", "updates", "custom"} <= set(seen)
    # The greeting arrives token by token, and the first token arrives while
    # the worker is still producing the others.
    assert seen.count("messages") >= 5
    assert status_at_first_token == "running"


def test_messages_tuple_parts_are_a_message_chunk_and_its_metadata(sdk):
    client = sdk()
    thread_id = interrupted_chat(client)
    tokens = [
        part.data
        for part in client.runs.stream(
            thread_id, "chat", command={"resume": "Bo"}, stream_mode="messages-tuple"
        )
        if part.event == "messages"
    ]
    chunk, metadata = tokens[0]
    assert chunk["type"] == "AIMessageChunk"
    assert metadata["langgraph_node"] == "greet"
    assert "".join(token[0]["content"] for token in tokens) == (
        "Hello Bo, nice to meet you."
    )


def test_stream_rejoined_with_last_event_id_loses_nothing(sdk):
    client = sdk()
    thread_id = interrupted_chat(client)
    run_id = None
    first_part = []
    stream = client.runs.stream(
        thread_id, "chat", command={"resume": "Ada"}, stream_mode="messages-tuple"
    )
    for part in stream:
        first_part.append(part)
        if part.event == "metadata":
            run_id = part.data["run_id"]
        if sum(p.event == "messages" for p in first_part) == 2:
            break  # the client drops the connection mid-answer
    stream.close()
    rest = list(
        client.runs.join_stream(thread_id, run_id, last_event_id=first_part[-1].id)
    )
    assert rest[-1].event == "end"
    ids = [part.id for part in first_part + rest]
    assert len(ids) == len(set(ids))  # nothing twice
    tokens = [
        part.data[0]["content"]
        for part in first_part + rest
        if part.event == "messages"
    ]
    assert "".join(tokens) == "Hello Ada, nice to meet you."  # nothing lost


def test_joining_a_finished_runs_stream_gets_its_end_at_once(sdk):
    client = sdk()
    thread_id = client.threads.create(metadata={"graph_id": "echo"})["thread_id"]
    run = client.runs.create(thread_id, "echo", input={"text": "x"})
    client.runs.join(thread_id, run["run_id"])
    assert [
        part.event for part in client.runs.join_stream(thread_id, run["run_id"])
    ] == ["end"]


def test_failed_run_ends_its_stream_with_an_error_and_wait_raises(sdk):
    client = sdk()
    thread_id = client.threads.create(metadata={"graph_id": "pay"})["thread_id"]
    events = [part.event for part in client.runs.stream(thread_id, "pay", input={})]
    assert events[-2:] == ["error", "end"]
    with pytest.raises(Exception, match="KeyError"):
        client.runs.wait(thread_id, "pay", input={}, multitask_strategy="enqueue")


def test_cancel_stops_a_running_run_at_its_next_step(sdk):
    client = sdk()
    thread_id = client.threads.create(metadata={"graph_id": "slow"})["thread_id"]
    run = client.runs.create(thread_id, "slow", input={})
    wait_for(
        lambda: client.runs.get(thread_id, run["run_id"])["status"] == "running",
        what="the run to start",
    )
    client.runs.cancel(thread_id, run["run_id"], wait=True)
    assert client.runs.get(thread_id, run["run_id"])["status"] == "interrupted"
    state = client.threads.get_state(thread_id)
    assert len(state["values"].get("ticks", [])) < 5
    assert client.threads.get(thread_id)["status"] == "idle"


def test_multitask_reject_refuses_a_second_run_while_one_runs(sdk):
    client = sdk()
    thread_id = client.threads.create(metadata={"graph_id": "slow"})["thread_id"]
    client.runs.create(thread_id, "slow", input={})
    with pytest.raises(ConflictError) as refused:
        client.runs.create(thread_id, "slow", input={}, multitask_strategy="reject")
    assert refused.value.body["code"] == "run_in_progress"


def test_multitask_enqueue_runs_the_second_run_after_the_first(sdk):
    client = sdk()
    thread_id = client.threads.create(metadata={"graph_id": "slow"})["thread_id"]
    first = client.runs.create(thread_id, "slow", input={})
    second = client.runs.create(
        thread_id, "slow", input={}, multitask_strategy="enqueue"
    )
    assert second["status"] == "pending"
    client.runs.join(thread_id, second["run_id"])
    first_run, second_run = (
        Run.objects.get(pk=first["run_id"]),
        Run.objects.get(pk=second["run_id"]),
    )
    assert first_run.status == second_run.status == Run.Status.SUCCEEDED
    assert first_run.ended_at <= second_run.started_at
    assert len(client.threads.get_state(thread_id)["values"]["ticks"]) == 10


def test_run_on_a_missing_thread_creates_it_when_asked(sdk):
    client = sdk()
    output = client.runs.wait(
        "made-by-the-run", "echo", input={"text": "x"}, if_not_exists="create"
    )
    assert output["echoed"] == "x"
    assert Thread.objects.get(thread_id="made-by-the-run").agent_name == "echo"


def test_a_run_never_creates_a_thread_whose_id_ends_in_a_newline(sdk):
    """if_not_exists="create" on /threads/case-9%0A/runs created the thread,
    queued its run, then answered 500 (the id in Content-Location: a header
    cannot hold a newline). The id is matched whole now: 400, nothing made."""
    client = sdk()
    with pytest.raises(BadRequestError) as refused:
        client.runs.create(
            "case-9\n", "echo", input={"text": "x"}, if_not_exists="create"
        )
    assert "thread_id" in refused.value.body["fields"]
    assert not Thread.objects.filter(tenant=client.tenant).exists()
    assert not Run.objects.filter(thread__tenant=client.tenant).exists()
