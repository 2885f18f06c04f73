"""Replay-safe values: a step that runs again sees what its first run drew."""

import json
from pathlib import Path

import pytest
from langgraph.types import Command, interrupt

from approvals.content import payload_of
from approvals.models import ApprovalRequest
from gatehouse import durable
from runs.models import RecordedValue
from runs.storage import content_clear
from tests.durable.helpers import InProcess, decide, start, state, wait_run
from tests.factories import tenant_with_client
from tests.workers import doomed_worker, wait_for

pytestmark = pytest.mark.django_db(transaction=True)
SAME = ("deadline", "ticket", "draw", "seeded")


def same_and_different(first: dict, again: dict) -> None:
    assert {key: again[key] for key in SAME} == {key: first[key] for key in SAME}
    assert again["wall_clock"] != first["wall_clock"]


@pytest.mark.worker
def test_values_drawn_before_an_approval_are_the_same_after_it(worker):
    _, client = tenant_with_client()
    run_id = start(client, "deadline", "d-1", {})
    assert wait_run(run_id).status == "interrupted"
    request = ApprovalRequest.objects.get(thread__thread_id="d-1")
    before = payload_of(request)["args"]

    assert wait_run(decide(client, "d-1")).status == "succeeded"
    same_and_different(before, state(client, "d-1")["seen"])


@pytest.mark.worker
def test_values_drawn_before_a_crash_are_the_same_after_it(worker, tmp_path):
    _, client = tenant_with_client()
    with doomed_worker(worker):
        run_id = start(client, "deadline", "d-2", {"dir": str(tmp_path), "hold": True})
        wait_for(lambda: (tmp_path / "held").exists(), what="the node to hold")
    Path(tmp_path, "release").touch()
    assert wait_run(run_id, "interrupted").attempts == 2

    first, again = map(json.loads, (tmp_path / "seen").read_text().splitlines())
    same_and_different(first, again)


@pytest.mark.worker
def test_recorded_values_are_stored_encrypted(worker):
    _, client = tenant_with_client()
    wait_run(start(client, "deadline", "d-3", {}))
    ticket = payload_of(ApprovalRequest.objects.get())["args"]["ticket"]
    stored = list(RecordedValue.objects.values_list("kind", "value"))
    assert sorted(kind for kind, _ in stored) == ["now", "random", "seed", "uuid4"]
    assert not any(ticket.encode() in bytes(value) for _, value in stored)


@pytest.mark.worker
def test_recorded_values_go_with_the_thread_content(worker):
    _, client = tenant_with_client()
    wait_run(start(client, "deadline", "d-4", {}))
    thread_pk = RecordedValue.objects.values_list("thread_id", flat=True).first()
    cleared = content_clear(thread_pks=[thread_pk])
    assert cleared[thread_pk]["recorded_values"] == 4
    assert not RecordedValue.objects.exists()


def test_helpers_outside_a_run_refuse():
    with pytest.raises(durable.OutsideRun):
        durable.now()


def test_a_step_that_draws_another_kind_at_a_recorded_position_is_refused():
    """The first execution drew now() first; the second asks for uuid4()."""
    draws = [durable.now, durable.uuid4]

    def node(state: dict) -> dict:
        draws.pop(0)()
        interrupt("wait")
        return {}

    graph = InProcess(node)
    graph.invoke({"x": 1}, run_id="start")
    with pytest.raises(durable.NonDeterministicStep, match="asked for now()"):
        graph.invoke(Command(resume="go"), run_id="resume")
