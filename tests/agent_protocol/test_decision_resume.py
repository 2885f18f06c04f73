"""A run that carries a reviewer's decision to the agent is not cancelled by
a client before the agent has it: not by another run's multitask strategy
(`interrupt`, `rollback`), which threw the decision away and started over
while the request still read approved, nor by a cancel; nor ever rolled
back. 409 `decision_resuming`. One past its gate's step (its first
checkpoint) can be interrupted; the thread's deletion stops it in any case."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from langgraph.checkpoint.base import empty_checkpoint

from approvals.models import ApprovalRequest
from runs.checkpointer import DjangoSaver
from runs.graphs import thread_config
from runs.models import Run, Thread
from tests.approvals.helpers import waiting_request
from tests.factories import REFUND_INPUT, api_client, make_api_key, make_tenant

pytestmark = pytest.mark.django_db


def _decided(approved: bool = True):
    """A request decided over the API: its resume run is queued. (approval,
    resume run, a runs-only client)"""
    tenant = make_tenant()
    approval = waiting_request(tenant)
    _, reviewer = make_api_key(tenant, ["approvals"])
    _, runs_only = make_api_key(tenant, ["runs"])
    body = {"approved": approved, "note": "fraud suspected"}
    decided = api_client(reviewer).post(
        f"/api/v1/approvals/{approval.pk}/decision", body, format="json"
    )
    assert decided.status_code == 200, decided.content
    (resume,) = Run.objects.filter(thread=approval.thread, kind=Run.Kind.RESUME)
    assert resume.status == Run.Status.QUEUED
    return approval, resume, api_client(runs_only)


@pytest.mark.parametrize("strategy", ["interrupt", "rollback"])
@pytest.mark.parametrize("approved", [True, False])
def test_a_multitask_run_does_not_cancel_a_decisions_resume(strategy, approved):
    approval, resume, client = _decided(approved)
    thread_id = approval.thread.thread_id
    runs_before = Run.objects.filter(thread=approval.thread).count()
    refused = _start(client, thread_id, strategy)
    assert refused.status_code == 409, refused.content
    assert refused.json()["code"] == "decision_resuming"
    assert "decision" in refused.json()["message"]
    resume.refresh_from_db()
    assert resume.status == Run.Status.QUEUED and not resume.cancel_action
    assert Run.objects.filter(thread=approval.thread).count() == runs_before
    assert Thread.objects.get(pk=approval.thread_id).status == Thread.Status.RUNNING
    # Queued behind it, the new run waits for the decision to reach the agent.
    queued = _start(client, thread_id, "enqueue")
    assert queued.status_code == 200, queued.content
    resume.refresh_from_db()
    assert resume.status == Run.Status.QUEUED


def test_a_cancel_of_a_decisions_resume_is_refused():
    approval, resume, client = _decided()
    thread_id = approval.thread.thread_id
    for action in ("interrupt", "rollback"):
        refused = client.post(
            f"/langgraph/threads/{thread_id}/runs/{resume.pk}/cancel?action={action}"
        )
        assert refused.status_code == 409, refused.content
        assert refused.json()["code"] == "decision_resuming"
    # Cancelling the thread's runs passes it by.
    many = client.post(
        "/langgraph/runs/cancel", {"thread_id": thread_id}, format="json"
    )
    assert many.status_code == 204, many.content
    resume.refresh_from_db()
    assert resume.status == Run.Status.QUEUED and not resume.cancel_action


def _start(client, thread_id: str, strategy: str):
    """A new run on the thread, with a multitask strategy for its active runs."""
    return client.post(
        f"/langgraph/threads/{thread_id}/runs",
        {"assistant_id": "refund", "input": REFUND_INPUT, "multitask_strategy": strategy},
        format="json",
    )


def _claimed(resume: Run, *, lease_seconds: int = 30) -> None:
    """As a worker's claim leaves it: running under a lease."""
    Run.objects.filter(pk=resume.pk).update(
        status=Run.Status.RUNNING,
        lease_owner="w:1",
        lease_until=timezone.now() + timedelta(seconds=lease_seconds),
    )


def _gate_step_written(resume: Run) -> None:
    """The resume's first checkpoint, as its worker writes it after the
    gate's step: the agent has the decision."""
    thread = Thread.objects.get(pk=resume.thread_id)
    metadata = {"source": "loop", "step": 1, "run_id": str(resume.pk)}
    DjangoSaver(tenant=thread.tenant).put(
        thread_config(thread), empty_checkpoint(), metadata, {}
    )


def _cancel(client, resume: Run, action: str):
    return client.post(
        f"/langgraph/threads/{resume.thread.thread_id}/runs/{resume.pk}/cancel"
        f"?action={action}"
    )


def test_a_running_decisions_resume_is_not_cancelled_before_its_gate_step():
    """Running is not enough: a worker lost before the gate's step leaves a
    cancelled run to the next claim, which records it cancelled without
    running the graph: the decision would never reach the agent."""
    approval, resume, client = _decided()
    _claimed(resume, lease_seconds=-1)  # its worker lost
    refused = _cancel(client, resume, "interrupt")
    assert refused.status_code == 409, refused.content
    assert refused.json()["code"] == "decision_resuming"
    resume.refresh_from_db()
    assert not resume.cancel_action


def test_a_decisions_resume_past_its_gate_step_can_be_interrupted_not_rolled_back():
    """Once it wrote a checkpoint the agent has the decision: stopping it is
    always possible, by a cancel or another run's `interrupt`. A rollback
    would delete what it wrote and leave the gate waiting on a settled
    request."""
    approval, resume, client = _decided()
    _claimed(resume)
    _gate_step_written(resume)
    refused = _cancel(client, resume, "rollback")
    assert refused.status_code == 409, refused.content
    assert refused.json()["code"] == "decision_resuming"
    refused = _start(client, approval.thread.thread_id, "rollback")
    assert refused.status_code == 409, refused.content
    resume.refresh_from_db()
    assert not resume.cancel_action

    stopped = _cancel(client, resume, "interrupt")
    assert stopped.status_code == 202, stopped.content
    resume.refresh_from_db()
    assert resume.cancel_action == Run.CancelAction.INTERRUPT


def test_another_runs_interrupt_stops_a_decisions_resume_past_its_gate_step():
    approval, resume, client = _decided()
    _claimed(resume)
    before_the_step = _start(client, approval.thread.thread_id, "interrupt")
    assert before_the_step.status_code == 409, before_the_step.content
    _gate_step_written(resume)
    started = _start(client, approval.thread.thread_id, "interrupt")
    assert started.status_code == 200, started.content
    resume.refresh_from_db()
    assert resume.cancel_action == Run.CancelAction.INTERRUPT


def test_deleting_the_thread_still_stops_a_decisions_resume():
    approval, resume, client = _decided()
    deleted = client.delete(f"/api/v1/threads/{approval.thread.thread_id}")
    assert deleted.status_code == 202, deleted.content
    resume.refresh_from_db()
    assert resume.status == Run.Status.CANCELLED


def test_a_raw_resume_of_an_input_interrupt_can_still_be_cancelled():
    """Only a decision is protected: a resume the client sent itself is the
    client's to cancel."""
    tenant = make_tenant()
    approval = waiting_request(tenant)
    ApprovalRequest.objects.filter(pk=approval.pk).delete()  # not a gate's now
    resume = Run.objects.create(
        tenant=tenant, thread=approval.thread, kind=Run.Kind.RESUME,
        agent_version=approval.thread.agent_version, status=Run.Status.QUEUED,
    )  # fmt: skip
    _, runs_only = make_api_key(tenant, ["runs"])
    cancelled = api_client(runs_only).post(
        f"/langgraph/threads/{approval.thread.thread_id}/runs/{resume.pk}/cancel"
    )
    assert cancelled.status_code == 202, cancelled.content
    resume.refresh_from_db()
    assert resume.status == Run.Status.CANCELLED
