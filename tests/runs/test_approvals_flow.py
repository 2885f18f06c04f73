"""Approvals over REST against a real worker: races, skew, queued decisions."""

import threading

import pytest
from django.db import connection

from approvals.models import ApprovalRequest, Decision
from runs.models import Run, Thread
from tests.factories import api_client, make_api_key, make_tenant
from tests.workers import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]




def interrupted_thread(client, agent, thread_id="t1"):
    client.post(
        "/api/v1/threads", {"thread_id": thread_id, "agent": agent}, format="json"
    )
    run_id = client.post(
        f"/api/v1/threads/{thread_id}/runs", {"input": {}}, format="json"
    ).json()["run_id"]
    wait_for(
        lambda: Run.objects.get(pk=run_id).status in {"interrupted", "failed"},
        what="the run to stop",
    )
    return Run.objects.get(pk=run_id)


def new_client():
    tenant = make_tenant()
    _, secret = make_api_key(tenant)
    return tenant, secret


def test_twenty_concurrent_decisions_have_exactly_one_winner(worker):
    _, secret = new_client()
    interrupted_thread(api_client(secret), "gate")
    approval = ApprovalRequest.objects.get()
    barrier = threading.Barrier(20)
    statuses: list[int] = []

    def decide(index: int) -> None:
        try:
            client = api_client(secret)
            barrier.wait()
            response = client.post(
                f"/api/v1/approvals/{approval.id}/decision",
                {"approved": True, "reviewer": f"r{index}"},
                format="json",
            )
            statuses.append(response.status_code)
        finally:
            connection.close()

    threads = [threading.Thread(target=decide, args=(i,)) for i in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(statuses) == [200] + [409] * 19
    assert Decision.objects.filter(request=approval).count() == 1
    assert Run.objects.filter(kind="resume").count() == 1


def test_payload_missing_fields_fails_the_run_naming_them(worker):
    _, secret = new_client()
    run = interrupted_thread(api_client(secret), "incomplete")
    assert run.status == "failed"
    body = api_client(secret).get(f"/api/v1/threads/t1/runs/{run.id}").json()
    assert "reason, affects, if_denied" in body["error"]
    assert not ApprovalRequest.objects.exists()
    assert Thread.objects.get(thread_id="t1").status == "error"


def test_resume_when_the_waiting_node_is_gone_is_version_skew(worker, settings):
    _, secret = new_client()
    client = api_client(secret)
    interrupted_thread(client, "gate")
    approval = ApprovalRequest.objects.get()
    settings.GATEHOUSE_AGENTS = "gate@1=tests.agents:gate_graph_renamed"
    response = client.post(
        f"/api/v1/approvals/{approval.id}/decision", {"approved": True}, format="json"
    )
    assert response.status_code == 409
    assert response.json()["code"] == "version_skew"
    assert "'ask'" in response.json()["message"]
    approval.refresh_from_db()
    assert approval.status == "pending" and not approval.decisions.exists()
    assert Thread.objects.get(thread_id="t1").status == "interrupted"
    assert not Run.objects.filter(kind="resume").exists()


def test_decision_during_a_running_resume_queues_behind_it(worker):
    _, secret = new_client()
    client = api_client(secret)
    interrupted_thread(client, "pair")
    left, right = (
        ApprovalRequest.objects.get(action=f"do_{side}") for side in ("left", "right")
    )
    first = client.post(
        f"/api/v1/approvals/{left.id}/decision", {"approved": True}, format="json"
    )
    first_run = first.json()["resumed_run"]["run_id"]
    wait_for(
        lambda: Run.objects.get(pk=first_run).status == "running",
        what="the first resume to start",
    )
    second = client.post(
        f"/api/v1/approvals/{right.id}/decision", {"approved": True}, format="json"
    )
    assert second.status_code == 200, second.content
    second_run = second.json()["resumed_run"]["run_id"]
    assert Run.objects.get(pk=first_run).status == "running"  # still executing
    wait_for(
        lambda: Run.objects.get(pk=second_run).status == "succeeded",
        timeout=30,
        what="the queued resume to run after the first",
    )
    state = client.get("/api/v1/threads/t1/state").json()
    labels = sorted(next(iter(answer)) for answer in state["values"]["answers"])
    assert labels == ["left", "right"]
    assert Thread.objects.get(thread_id="t1").status == "idle"
