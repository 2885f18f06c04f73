"""The approval gate through the Agent Protocol API: nothing the SDK can send
continues past a gate that has no decision. Each way answers 409 naming the
request to decide through /api/v1/approvals/{id}/decision, and the thread
stays where it was."""

from __future__ import annotations

import pytest
from langgraph_sdk.errors import ConflictError

from approvals.models import ApprovalRequest
from runs.models import Run

pytestmark = pytest.mark.worker


@pytest.fixture
def gated(sdk):
    """A client, and a thread of the `gate` agent waiting on its approval."""
    client = sdk()
    thread_id = client.threads.create(metadata={"graph_id": "gate"})["thread_id"]
    output = client.runs.wait(thread_id, "gate", input={})
    assert output["__interrupt__"][0]["value"]["action"] == "do_one"
    request = ApprovalRequest.objects.get(thread__thread_id=thread_id)
    return client, thread_id, request


def _assert_refused_naming(refused, request) -> None:
    body = refused.value.body
    assert refused.value.status_code == 409
    assert body["code"] == "approval_required"
    assert str(request.pk) in str(body)


def _assert_untouched(client, thread_id, request) -> None:
    request.refresh_from_db()
    assert request.status == ApprovalRequest.Status.PENDING
    assert client.threads.get(thread_id)["status"] == "interrupted"
    assert not Run.objects.filter(
        thread__thread_id=thread_id, kind=Run.Kind.RESUME
    ).exists()


def test_a_command_resume_of_a_gate_is_409_naming_the_request(gated):
    client, thread_id, request = gated
    with pytest.raises(ConflictError) as refused:
        client.runs.create(
            thread_id, "gate", command={"resume": {"approved": True, "note": "me"}}
        )
    _assert_refused_naming(refused, request)
    _assert_untouched(client, thread_id, request)


def test_a_state_update_as_the_gated_node_is_409(gated):
    client, thread_id, request = gated
    with pytest.raises(ConflictError) as refused:
        client.threads.update_state(
            thread_id, {"answers": [{"one": {"approved": True}}]}, as_node="ask"
        )
    _assert_refused_naming(refused, request)
    _assert_untouched(client, thread_id, request)


def test_a_run_from_a_checkpoint_past_the_gate_is_409(gated):
    client, thread_id, request = gated
    first = client.threads.get_history(thread_id, limit=10)[-1]
    with pytest.raises(ConflictError) as refused:
        client.runs.create(
            thread_id,
            "gate",
            input=None,
            checkpoint_id=first["checkpoint"]["checkpoint_id"],
            multitask_strategy="interrupt",
        )
    _assert_refused_naming(refused, request)
    _assert_untouched(client, thread_id, request)
