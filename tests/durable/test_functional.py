"""Functional API agents (`@entrypoint` with `@task`s) run like graph agents."""

from pathlib import Path

import pytest

from approvals.models import ApprovalRequest
from audit.models import AuditEvent
from runs import registry
from runs.checkpointer import DjangoSaver
from tests.durable.helpers import decide, start, state, wait_run
from tests.factories import tenant_with_client
from tests.workers import doomed_worker, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


def test_entrypoint_is_listed_with_its_description():
    spec = registry.get("tasks", "1")
    assert spec.is_functional
    assert spec.description.startswith("Runs a task, optionally a held one")


def test_interrupt_inside_a_task_becomes_an_approval_request(worker):
    tenant, client = tenant_with_client()
    run_id = start(client, "tasks", "f-1", {})
    assert wait_run(run_id).status == "interrupted"
    request = ApprovalRequest.objects.get(thread__thread_id="f-1")
    assert (request.action, request.gate, request.status) == (
        "ship",
        "action",
        "pending",
    )

    resumed = decide(client, "f-1", note="fine")
    assert wait_run(resumed).status == "succeeded"
    values = state(client, "f-1")
    assert values["decision"]["approved"] is True
    assert values["decision"]["approval_id"] == str(request.pk)
    kinds = set(
        AuditEvent.objects.for_tenant(tenant)
        .filter(thread_id="f-1")
        .values_list("kind", flat=True)
    )
    assert {"run.interrupted", "approval.requested", "run.succeeded"} <= kinds


def test_incomplete_payload_inside_a_task_fails_the_run(worker):
    _, client = tenant_with_client()
    run_id = start(client, "tasks", "f-2", {"payload": {"action": "ship"}})
    run = wait_run(run_id)
    assert run.status == "failed"
    error = client.get(f"/api/v1/threads/f-2/runs/{run_id}").json()["error"]
    assert "reason, affects, if_denied" in error
    assert not ApprovalRequest.objects.exists()


def test_worker_killed_between_tasks_does_not_run_the_finished_task_again(
    worker, tmp_path
):
    """LangGraph records a task's result as a pending write just after the
    task returns; a crash after that does not run the task again."""
    tenant, client = tenant_with_client()

    def first_result_recorded() -> bool:
        # Read as LangGraph does: a task's writes may share a row (packed).
        latest = DjangoSaver(tenant=tenant).get_tuple(
            {"configurable": {"thread_id": "f-3", "checkpoint_ns": ""}}
        )
        return latest is not None and any(
            channel == "__return__" for _, channel, _ in latest.pending_writes
        )

    with doomed_worker(worker):
        run_id = start(client, "tasks", "f-3", {"dir": str(tmp_path), "hold": True})
        wait_for(lambda: (tmp_path / "second").exists(), what="the second task")
        wait_for(first_result_recorded, what="the first task's result to be recorded")
    Path(tmp_path, "release").touch()
    run = wait_run(run_id, "interrupted")

    assert run.attempts == 2
    assert len((tmp_path / "first").read_text().splitlines()) == 1
    assert len((tmp_path / "second").read_text().splitlines()) == 2
