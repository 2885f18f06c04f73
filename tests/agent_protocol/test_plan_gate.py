"""The plan gate through the Agent Protocol API: a command that resumes the
plan's interrupt with an approval of its own making is refused, as every
gate is, naming the request to decide."""

from __future__ import annotations

import pytest
from langgraph_sdk.errors import ConflictError

from approvals.models import ApprovalRequest
from tests.agent_protocol.test_gate import _assert_refused_naming, _assert_untouched
from tests.approvals.plan_helpers import order

pytestmark = pytest.mark.worker


def test_a_command_resume_of_the_plan_gate_is_409_naming_the_request(sdk):
    client = sdk()
    thread_id = client.threads.create(metadata={"graph_id": "doc-plan"})["thread_id"]
    output = client.runs.wait(thread_id, "doc-plan", input={"order": order()})
    assert output["__interrupt__"][0]["value"]["gate"] == "plan"
    request = ApprovalRequest.objects.get(thread__thread_id=thread_id)
    steps = output["__interrupt__"][0]["value"]["args"]["steps"]
    approving = {"approved": True, "note": "", "args": {"steps": steps[:1]}}
    for command in (
        {"resume": approving},
        {"resume": {request.interrupt_id: approving}},
    ):
        with pytest.raises(ConflictError) as refused:
            client.runs.create(thread_id, "doc-plan", command=command)
        _assert_refused_naming(refused, request)
    _assert_untouched(client, thread_id, request)
    assert not client.threads.get_state(thread_id)["values"].get("done")
