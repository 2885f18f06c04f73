"""Continuing a thread whose step past a gate is pending (the run after the
decision failed) is the compliance officer's Retry, on the record: no `runs`
key continues it by starting a run without input, not after the officer
closed it, and not on a copy, where the approved action would run a second
time under the copy's own idempotency keys."""

import pytest
from rest_framework.test import APIClient

from audit.services import Actor
from runs.models import Run, Thread
from runs.services import thread_close
from tests.agents import provider_marker
from tests.factories import make_api_key, tenant_with_client
from tests.runs.test_recovery import failed_after_approval

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


def runs_key(tenant, scopes=("runs",)) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_X_API_KEY=make_api_key(tenant, list(scopes))[1])
    return client


def acted(api, thread_id="t1") -> bool:
    values = api.get(f"/api/v1/threads/{thread_id}/state").json()["values"]
    return {"acted": True} in values.get("answers", [])


@pytest.fixture
def provider_up():
    """The flaky agent's provider answers: an attempt would act."""
    markers = []

    def up(thread: Thread):
        marker = provider_marker(thread.pk)
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
        markers.append(marker)

    yield up
    for marker in markers:
        marker.unlink(missing_ok=True)


def test_a_run_without_input_does_not_continue_past_the_gate(worker, provider_up):
    tenant, api = tenant_with_client()
    thread = failed_after_approval(api)
    provider_up(thread)
    runs_before = Run.objects.count()
    refused = runs_key(tenant).post(
        "/langgraph/threads/t1/runs", {"assistant_id": "flaky"}, format="json"
    )
    assert refused.status_code == 409, refused.content
    assert refused.json()["code"] == "approval_required"
    assert Run.objects.count() == runs_before and not acted(api)


def test_a_closed_thread_is_not_continued_past_its_gate(worker, provider_up):
    tenant, api = tenant_with_client()
    thread = failed_after_approval(api)
    thread_close(thread=thread, actor=Actor.system("officer"), note="done by hand")
    provider_up(thread)
    refused = runs_key(tenant).post(
        "/langgraph/threads/t1/runs", {"assistant_id": "flaky"}, format="json"
    )
    assert refused.status_code == 409, refused.content
    assert not acted(api)


def test_a_thread_stopped_past_its_gate_is_not_copied(worker, provider_up):
    tenant, api = tenant_with_client()
    failed_after_approval(api)
    refused = runs_key(tenant).post("/langgraph/threads/t1/copy", {}, format="json")
    assert refused.status_code == 409, refused.content
    assert refused.json()["code"] == "approval_required"
    assert Thread.objects.count() == 1


def test_a_run_from_the_latest_checkpoint_without_input_does_not_pass_it(
    worker, provider_up
):
    """The same continuation, named as a run from the thread's latest
    checkpoint (a `time_travel` key)."""
    tenant, api = tenant_with_client()
    thread = failed_after_approval(api)
    provider_up(thread)
    latest = api.get("/api/v1/threads/t1/state").json()["checkpoint_id"]
    refused = runs_key(tenant, ("runs", "time_travel")).post(
        "/langgraph/threads/t1/runs",
        {"assistant_id": "flaky", "checkpoint_id": latest},
        format="json",
    )
    assert refused.status_code == 409, refused.content
    assert refused.json()["code"] == "approval_required"
    assert not acted(api)
