"""Every Agent Protocol response that decrypts thread content leaves exactly
one `*.read` audit event (issue 16, finding 6), as /api/v1 does
(tests/runs/test_read_audit.py); another tenant's thread is a 404 and leaves
none.

| SDK call (path) | event |
|---|---|
| threads.get, threads.update, threads.copy, threads.create(if_exists="do_nothing") | thread.state_read |
| threads.get_state (GET .../state, .../state/{checkpoint}, POST .../state/checkpoint) | thread.state_read |
| threads.get_history (POST .../history) | thread.history_read |
| threads.search (values of a page of threads) | thread.states_read, one for the page |
| runs.wait, runs.stream, runs.join, runs.join_stream | run.output_read |

Searches and thread bodies that `select` no values or interrupts, runs.get
and runs.list decrypt nothing.
"""

from __future__ import annotations

import httpx
import pytest
from langgraph_sdk.errors import NotFoundError

from audit.events import READS
from audit.models import AuditEvent

pytestmark = pytest.mark.worker

READ_KINDS = sorted(READS)


def reads() -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(kind__in=READ_KINDS).order_by("id"))


def one_read(client, call) -> AuditEvent:
    before = {event.pk for event in reads()}
    call()
    new = [event for event in reads() if event.pk not in before]
    assert len(new) == 1, [event.kind for event in new]
    assert new[0].tenant_id == client.tenant.pk
    return new[0]


def test_each_read_of_content_is_one_event_and_another_tenants_404_none(sdk):
    client, stranger = sdk(), sdk()
    thread_id = client.threads.create(metadata={"graph_id": "echo"})["thread_id"]
    second = client.threads.create(metadata={"graph_id": "echo"})["thread_id"]
    client.runs.wait(second, "echo", input={"text": "two"})

    event = one_read(
        client, lambda: client.runs.wait(thread_id, "echo", input={"text": "one"})
    )
    assert event.kind == "run.output_read" and event.data["how"] == "wait"
    event = one_read(
        client,
        lambda: list(client.runs.stream(thread_id, "echo", input={"text": "x"})),
    )
    assert event.kind == "run.output_read"
    run_id = client.runs.list(thread_id)[0]["run_id"]
    checkpoint = client.threads.get_state(thread_id)["checkpoint"]

    calls = {
        "threads.get": (
            lambda: client.threads.get(thread_id),
            "thread.state_read",
        ),
        "threads.update": (
            lambda: client.threads.update(thread_id, metadata={}),
            "thread.state_read",
        ),
        "threads.get_state": (
            lambda: client.threads.get_state(thread_id),
            "thread.state_read",
        ),
        "threads.get_state(checkpoint_id)": (
            lambda: client.threads.get_state(
                thread_id, checkpoint_id=checkpoint["checkpoint_id"]
            ),
            "thread.state_read",
        ),
        "threads.get_state(checkpoint)": (
            lambda: client.threads.get_state(thread_id, checkpoint=checkpoint),
            "thread.state_read",
        ),
        "threads.get_history": (
            lambda: client.threads.get_history(thread_id),
            "thread.history_read",
        ),
        "runs.join": (
            lambda: client.runs.join(thread_id, run_id),
            "run.output_read",
        ),
        "runs.join_stream": (
            lambda: list(client.runs.join_stream(thread_id, run_id)),
            "run.output_read",
        ),
    }
    for name, (call, kind) in calls.items():
        for _ in range(2):
            assert one_read(client, call).kind == kind, name

    # A search's page is one read, naming the threads it showed.
    event = one_read(client, lambda: client.threads.search(limit=10))
    assert event.kind == "thread.states_read"
    assert sorted(event.data["thread_ids"]) == sorted([thread_id, second])
    assert event.data["count"] == 2
    before = len(reads())
    client.threads.search(select=["thread_id", "status"])
    client.runs.get(thread_id, run_id)
    client.runs.list(thread_id)
    assert len(reads()) == before

    copy = one_read(client, lambda: client.threads.copy(thread_id))
    assert copy.kind == "thread.state_read" and copy.thread_id != thread_id

    stranger_calls = {
        "threads.get": lambda: stranger.threads.get(thread_id),
        "threads.get_state": lambda: stranger.threads.get_state(thread_id),
        "threads.get_history": lambda: stranger.threads.get_history(thread_id),
        "runs.join": lambda: stranger.runs.join(thread_id, run_id),
        "runs.join_stream": lambda: list(stranger.runs.join_stream(thread_id, run_id)),
        "threads.copy": lambda: stranger.threads.copy(thread_id),
    }
    before = len(reads())
    for name, call in stranger_calls.items():
        # The SDK raises its own error for most calls, httpx's for joins.
        with pytest.raises((NotFoundError, httpx.HTTPStatusError)) as refused:
            call()
        assert refused.value.response.status_code == 404, name
    assert stranger.threads.search() == []
    assert len(reads()) == before
