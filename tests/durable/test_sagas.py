"""Retries, timeouts and compensation of side effects (runs.tools,
runs.compensation), with the bundled `fulfilment` agent on a real worker."""

import threading
from pathlib import Path

import pytest

from approvals.models import ApprovalRequest
from audit.models import AuditEvent
from audit.services import Actor
from demo.models import (
    DemoCharge,
    DemoCourierBooking,
    DemoCourierCall,
    DemoStockReservation,
)
from gatehouse import durable
from runs.compensation import compensation_key
from runs.models import Run, Thread, ToolCall
from runs.services import run_retry, thread_close
from tests.demo.test_fulfilment import order
from tests.durable.helpers import InProcess, plan_approved, start, wait_run
from tests.factories import api_client, make_api_key, make_member, tenant_with_client
from tests.workers import doomed_worker, wait_for


def outcomes(call: ToolCall) -> list[str]:
    return [entry["outcome"] for entry in call.attempt_log]


def kinds(thread_id: str, *names: str) -> list[tuple[str, str]]:
    return list(
        AuditEvent.objects.filter(thread_id=thread_id, kind__in=names)
        .order_by("seq")
        .values_list("kind", "action")
    )


@pytest.mark.django_db(transaction=True)
@pytest.mark.worker
def test_a_call_that_succeeds_on_its_third_attempt_keeps_one_key(worker):
    _, client = tenant_with_client()
    started = start(client, "fulfilment", "o-1", order(courier_outages=2))
    run = wait_run(plan_approved(client, "o-1", started))
    assert run.status == "succeeded"

    call = ToolCall.objects.get(tool="courier.book")
    assert (call.status, call.attempts) == ("succeeded", 3)
    assert outcomes(call) == ["failed", "failed", "succeeded"]
    assert [e.get("error_type") for e in call.attempt_log[:2]] == [
        "CourierUnavailable"
    ] * 2
    # Every attempt reached the courier with the same key; one pickup exists.
    assert list(DemoCourierCall.objects.values_list("idempotency_key", "outcome")) == [
        (call.idempotency_key, "unavailable"),
        (call.idempotency_key, "unavailable"),
        (call.idempotency_key, "booked"),
    ]
    assert DemoCourierBooking.objects.get().idempotency_key == call.idempotency_key
    failed = AuditEvent.objects.filter(thread_id="o-1", kind="tool_call.failed")
    assert [e.summary for e in failed.order_by("seq")] == [
        "courier.book attempt 1 failed (CourierUnavailable); retrying in 0.5s",
        "courier.book attempt 2 failed (CourierUnavailable); retrying in 1s",
    ]


@pytest.mark.django_db(transaction=True)
@pytest.mark.worker
def test_a_refused_booking_undoes_the_charge_then_the_reservation(worker):
    _, client = tenant_with_client()
    started = start(client, "fulfilment", "o-2", order(courier_refuses=True))
    run_id = plan_approved(client, "o-2", started)
    assert wait_run(run_id).status == "failed"

    body = client.get(f"/api/v1/threads/o-2/runs/{run_id}").json()
    assert body["status"] == "failed" and body["compensation"] == "compensated"
    assert body["error"] == (
        "ActivityFailed: courier.book failed on attempt 1, not retryable: "
        "CourierRefused: the courier refused order ORD-1: no service\n"
        "Compensation: undone, newest first: cards.charge, warehouse.reserve"
    )
    # Not retried: the refusal is not in the policy's retry_on.
    assert outcomes(ToolCall.objects.get(tool="courier.book")) == ["failed"]
    charge, reservation = DemoCharge.objects.get(), DemoStockReservation.objects.get()
    assert charge.refunded_at and reservation.released_at
    assert charge.refunded_at < reservation.released_at
    assert client.get("/api/v1/threads/o-2").json()["status"] == "idle"
    assert kinds("o-2", "run.compensating", "tool.compensated", "run.compensated") == [
        ("run.compensating", ""),
        ("tool.compensated", "refund_charge"),
        ("tool.compensated", "release_stock"),
        ("run.compensated", ""),
    ]
    summaries = AuditEvent.objects.filter(thread_id="o-2", kind="tool.compensated")
    assert (
        summaries.order_by("seq")
        .first()
        .summary.startswith("cards.charge undone by refund_charge (key ")
    )


@pytest.mark.django_db(transaction=True)
@pytest.mark.worker
def test_a_courier_down_past_its_retries_fails_for_good_and_compensates(worker):
    _, client = tenant_with_client()
    started = start(client, "fulfilment", "o-3", order(courier_outages=5))
    run_id = plan_approved(client, "o-3", started)
    run = wait_run(run_id)
    assert (run.status, run.compensation) == ("failed", "compensated")
    error = client.get(f"/api/v1/threads/o-3/runs/{run_id}").json()["error"]
    assert error.startswith(
        "ActivityFailed: courier.book failed after 3 attempt(s): CourierUnavailable"
    )
    assert DemoCourierCall.objects.count() == 3
    assert not DemoCourierBooking.objects.exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.worker
def test_a_denied_charge_releases_the_reserved_stock(worker):
    tenant, client = tenant_with_client()
    started = start(client, "fulfilment", "o-4", order(amount="900.00"))
    # The plan is high risk too (the charge is): a person approves it beside
    # the service key.
    reviewer = api_client(
        make_api_key(tenant, ["approvals"], user=make_member(tenant).user)[1]
    )
    assert wait_run(started).status == "interrupted"
    plan = ApprovalRequest.objects.get(gate="plan")
    for decider in (reviewer, client):
        approved = decider.post(
            f"/api/v1/approvals/{plan.pk}/decision", {"approved": True}, format="json"
        ).json()
    run = wait_run(approved["resumed_run"]["run_id"])
    assert run.status == "interrupted"
    request = ApprovalRequest.objects.get(gate="action")
    denied = reviewer.post(
        f"/api/v1/approvals/{request.pk}/decision",
        {"approved": False, "note": "The customer asked us to cancel."},
        format="json",
    ).json()
    resumed = wait_run(denied["resumed_run"]["run_id"])
    assert (resumed.status, resumed.compensation) == ("failed", "compensated")
    assert DemoStockReservation.objects.get().released_at is not None
    assert not DemoCharge.objects.exists()
    # The reservation was made by the first run, undone by the resume run.
    undo = ToolCall.objects.get(compensates__tool="warehouse.reserve")
    assert undo.run_id == str(resumed.pk) != undo.compensates.run_id
    assert Thread.objects.get(thread_id="o-4").status == "idle"


@pytest.mark.django_db(transaction=True)
@pytest.mark.worker
def test_a_worker_killed_mid_compensation_neither_skips_nor_repeats_an_undo(worker):
    """The courier refuses; the worker undoing the order is SIGKILLed while
    the warehouse answers the second undo (the release is committed there,
    not yet in the ledger). The worker that takes the run over does not
    refund again, releases again with the same key, and ends compensated."""
    _, client = tenant_with_client()
    with doomed_worker(worker, GATEHOUSE_DEMO_UNDO_LATENCY="8"):
        started = start(client, "fulfilment", "o-5", order(courier_refuses=True))
        run_id = plan_approved(client, "o-5", started)
        wait_for(
            lambda: DemoStockReservation.objects.filter(
                released_at__isnull=False
            ).exists(),
            timeout=120,
            what="the stock to be released",
        )
    released_at = DemoStockReservation.objects.get().released_at
    refunded_at = DemoCharge.objects.get().refunded_at
    run = wait_run(run_id, "failed", timeout=120)

    assert (run.status, run.compensation, run.attempts) == ("failed", "compensated", 2)
    refund = ToolCall.objects.get(compensates__tool="cards.charge")
    release = ToolCall.objects.get(compensates__tool="warehouse.reserve")
    assert outcomes(refund) == ["succeeded"]  # undone once, never again
    assert outcomes(release) == ["lost", "succeeded"]  # again, with its one key
    assert refund.pk < release.pk  # newest first: the charge, then the stock
    assert DemoStockReservation.objects.get().released_at == released_at
    assert DemoCharge.objects.get().refunded_at == refunded_at
    assert kinds("o-5", "tool.compensated", "run.recovered", "run.compensated") == [
        ("tool.compensated", "refund_charge"),
        ("run.recovered", ""),
        ("tool.compensated", "release_stock"),
        ("run.compensated", ""),
    ]
    assert Run.objects.get(pk=run_id).status == "failed"


# In-process: what needs no worker.


def _never(args, result, key):
    raise AssertionError("not called")


@pytest.mark.django_db(transaction=True)
def test_an_attempt_past_its_timeout_is_tried_again_with_the_same_key():
    answer = threading.Event()
    keys = []

    def perform(key):
        keys.append(key)
        if len(keys) == 1:
            answer.wait(30)  # no answer in time; released below
        return {"ok": len(keys)}

    def node(state):
        policy = durable.RetryPolicy(attempts=2, backoff=0)
        return {
            "result": durable.side_effect(
                "slow.call", {}, perform, retry=policy, timeout=0.2
            )
        }

    try:
        values = InProcess(node).invoke({})
    finally:
        answer.set()
    assert values["result"] == {"ok": 2}
    assert keys[0] == keys[1]
    assert outcomes(ToolCall.objects.get()) == ["timed_out", "succeeded"]


@pytest.mark.django_db(transaction=True)
def test_a_compensation_must_be_importable_by_name():
    def node(state):
        durable.side_effect("x.do", {}, lambda key: 1, compensate=lambda *a: None)
        return {}

    with pytest.raises(TypeError, match="cannot be imported by name"):
        InProcess(node).invoke({})
    assert not ToolCall.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_compensable_call_keeps_its_arguments_encrypted():
    def node(state):
        durable.side_effect(
            "x.do", {"card": "4242"}, lambda key: {"id": 1}, compensate=_never
        )
        return {}

    InProcess(node).invoke({})
    call = ToolCall.objects.get()
    assert call.compensation == "tests.durable.test_sagas:_never"
    assert b"4242" not in bytes(call.args)


def test_a_retry_policy_waits_longer_each_time_up_to_its_maximum():
    policy = durable.RetryPolicy(attempts=5, backoff=1, multiplier=3, max_backoff=5)
    assert [policy.wait_before(n) for n in (2, 3, 4)] == [1, 3, 5]
    with pytest.raises(ValueError):
        durable.RetryPolicy(attempts=0)


@pytest.mark.django_db(transaction=True)
@pytest.mark.worker
def test_an_undo_that_fails_leaves_the_thread_in_error_and_a_retry_undoes_it(
    worker, tmp_path
):
    _, client = tenant_with_client()
    Path(tmp_path, "blocked").touch()
    run_id = start(client, "undo", "u-1", {"dir": str(tmp_path)})
    run = wait_run(run_id, timeout=120)
    assert (run.status, run.compensation) == ("failed", "failed")
    error = client.get(f"/api/v1/threads/u-1/runs/{run_id}").json()["error"]
    assert error == (
        "ValueError: the next step fails for good\nCompensation: "
        "undo_unless_blocked failed after 5 attempt(s): RuntimeError: the "
        "warehouse does not answer; not undone: test.reserve"
    )
    thread = Thread.objects.get(thread_id="u-1")
    assert thread.status == "error"

    Path(tmp_path, "blocked").unlink()
    retry = run_retry(thread=thread, actor=Actor.system("tests"))
    retried = wait_run(str(retry.pk))
    assert (retried.status, retried.compensation) == ("failed", "compensated")
    assert retried.error_type == "ValueError"
    # The retry undid the reservation; it did not run the graph again.
    assert len(Path(tmp_path, "undone").read_text().splitlines()) == 1
    assert len(Path(tmp_path, "failed").read_text().splitlines()) == 1
    assert Thread.objects.get(thread_id="u-1").status == "idle"
    undo = ToolCall.objects.get(compensates__isnull=False)
    assert outcomes(undo) == ["failed"] * 5 + ["succeeded"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.worker
def test_closing_a_thread_whose_undo_failed_settles_it_for_later_runs(
    worker, tmp_path
):
    """The undo fails for good; an officer closes the thread instead of
    retrying. A later run on the thread that fails undoes its own call, never
    the earlier run's, which the close left done and said so."""
    _, client = tenant_with_client()
    Path(tmp_path, "blocked").touch()
    first = wait_run(start(client, "undo", "u-2", {"dir": str(tmp_path)}), timeout=120)
    assert (first.status, first.compensation) == ("failed", "failed")
    earlier = ToolCall.objects.get(tool="test.reserve")

    thread_close(
        thread=Thread.objects.get(thread_id="u-2"),
        actor=Actor.system("officer"),
        note="the warehouse released it by hand",
    )
    closed = AuditEvent.objects.get(thread_id="u-2", kind="thread.closed")
    assert (closed.data["not_undone"], closed.data["not_undone_calls"]) == (
        ["test.reserve"],
        [earlier.pk],
    )
    assert "warehouse" not in str(closed.data)  # the note only as a digest

    Path(tmp_path, "blocked").unlink()
    started = client.post(
        "/api/v1/threads/u-2/runs", {"input": {"dir": str(tmp_path)}}, format="json"
    )
    assert started.status_code == 202, started.content
    second = wait_run(started.json()["run_id"], timeout=120)
    assert (second.status, second.compensation) == ("failed", "compensated")

    later = ToolCall.objects.get(tool="test.reserve", run_id=str(second.pk))
    assert later.pk != earlier.pk
    undo = ToolCall.objects.get(compensates__isnull=False, status="succeeded")
    assert undo.compensates_id == later.pk
    assert not ToolCall.objects.filter(
        compensates=earlier, status="succeeded"
    ).exists()
    # One undoing reached the warehouse: the later reservation's.
    undone = Path(tmp_path, "undone").read_text().splitlines()
    assert undone == [f'"{compensation_key(later)}"']
    error = client.get(f"/api/v1/threads/u-2/runs/{second.pk}").json()["error"]
    assert error.endswith("Compensation: undone, newest first: test.reserve")
    assert Thread.objects.get(thread_id="u-2").status == "idle"
