"""Attacks on the gate through POST /threads/{id}/resume, executed by a real
worker: a gate resumed with a value that no decision on its own request gave."""

import pytest

from approvals.content import resume_value_of
from approvals.models import ApprovalRequest
from runs.crypto import ThreadCipher
from runs.models import Run, Thread
from tests.approvals.helpers import wait_run
from tests.factories import api_client, make_api_key, make_tenant

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


def key_client(tenant, scopes):
    return api_client(make_api_key(tenant, scopes)[1])


def test_a_gate_is_not_resumed_with_the_decision_of_an_earlier_gate_of_its_node(
    worker,
):
    """A node that asks twice: LangGraph numbers the task's interrupts and
    resumes its next one with a value keyed by its first interrupt's id. The
    first decision's value is no secret (verdict, note, reviewer, args: what
    the thread's state and the approvals API show), so a `runs` key replayed
    it, keyed by the first, settled interrupt, to pass the second gate."""
    tenant = make_tenant()
    runs = key_client(tenant, ["runs"])
    runs.post("/api/v1/threads", {"thread_id": "t1", "agent": "twice"}, format="json")
    started = runs.post("/api/v1/threads/t1/runs", {"input": {}}, format="json")
    wait_run(runs, "t1", started.json()["run_id"], "interrupted")
    first = ApprovalRequest.objects.get(action="do_first")
    decided = key_client(tenant, ["approvals"]).post(
        f"/api/v1/approvals/{first.pk}/decision", {"approved": True}, format="json"
    )
    wait_run(runs, "t1", decided.json()["resumed_run"]["run_id"], "interrupted")
    second = ApprovalRequest.objects.get(action="do_second", status="pending")
    first.refresh_from_db()
    replayed = resume_value_of(first, ThreadCipher.for_thread(first.thread))

    response = runs.post(
        "/api/v1/threads/t1/resume",
        {"resume": {first.interrupt_id: replayed}},
        format="json",
    )

    assert response.status_code == 409, response.content
    assert response.json()["code"] == "approval_required"
    assert response.json()["pending_approvals"] == [str(second.pk)]
    second.refresh_from_db()
    assert second.status == "pending"
    assert Run.objects.filter(kind="resume").count() == 1
    assert Thread.objects.get(thread_id="t1").status == "interrupted"
