"""A worker as deployed (prefork, the settings' broker options) SIGKILLed
while it holds a run: Gatehouse's recovery sweep, not the broker, gives the
run to another worker. The broker keeps no copy of a message a worker has
taken (no kombu ack emulation, config.settings), so these tests also check
that nothing of it is left in Redis for kombu to redeliver; and that a
worker stopped as a deploy stops it puts back what it held."""

import os
import signal
import uuid
from pathlib import Path

import pytest
import redis
from django.conf import settings

from demo.models import DemoPayment
from runs.dispatch import runs_recover_stalled
from runs.models import Run, ToolCall
from tests.durable.helpers import decide, start, wait_run
from tests.factories import REFUND_INPUT, tenant_with_client
from tests.workers import Worker, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


def held_by_broker() -> int:
    """Copies of task messages in the broker: the queue's, and the notes of
    taken messages kombu would redeliver (its ack emulation's keys)."""
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    return (
        client.llen("celery") + client.hlen("unacked") + client.zcard("unacked_index")
    )


def pool_processes(worker: Worker) -> list[int]:
    found = []
    for task in Path(f"/proc/{worker.process.pid}/task").iterdir():
        found += [int(pid) for pid in (task / "children").read_text().split()]
    return found


@pytest.fixture
def crash_site(worker):
    """The session's worker stopped (only the test's workers take runs), and
    back afterwards; the test's workers stopped whatever happens."""
    started: list[Worker] = []
    worker.stop()
    try:
        yield started
    finally:
        for each in started:
            each.stop()
        worker.__init__(name="main")


def test_a_run_whose_worker_is_killed_mid_task_is_run_again(crash_site):
    """SIGKILL while the run pays (the provider has recorded the payment, the
    ledger not yet): the message is gone from the broker, the run's lease
    expires, the sweep dispatches it again, and a fresh worker finishes it."""
    tenant, client = tenant_with_client()
    doomed = Worker(name="doomed", env={"GATEHOUSE_DEMO_PAYMENT_LATENCY": "30"})
    crash_site.append(doomed)
    start_run = start(client, "refund", "crash-1", REFUND_INPUT)
    wait_run(start_run, "interrupted")
    resumed = decide(client, "crash-1")
    wait_for(
        lambda: DemoPayment.objects.filter(order_id="A-1001").exists(),
        what="the provider to record the payment",
    )
    assert Run.objects.get(pk=resumed).status == "running"
    assert held_by_broker() == 0  # nothing kombu could hand back
    doomed.kill()

    crash_site.append(Worker(name="fresh"))
    wait_for(
        lambda: runs_recover_stalled()["expired_leases"],
        timeout=20,
        what="the killed worker's lease to expire",
    )
    run = wait_run(resumed, "succeeded")
    assert run.attempts == 2
    assert DemoPayment.objects.filter(order_id="A-1001").count() == 1
    assert ToolCall.objects.get(tool="payments.refund").attempts == 2


def test_a_run_whose_message_dies_with_its_worker_is_run_again(crash_site):
    """The worker's parent has taken the run's message (it is no longer in
    Redis) but no pool process has claimed the run (they are stopped) when
    the worker is SIGKILLed: the run is still queued, and the sweep finds it
    once it has waited a lease length."""
    _, client = tenant_with_client()
    doomed = Worker(name="doomed")
    crash_site.append(doomed)
    for pid in pool_processes(doomed):
        os.kill(pid, signal.SIGSTOP)
    run_id = start(client, "refund", "crash-2", REFUND_INPUT)
    wait_for(lambda: not held_by_broker(), what="the worker to take the message")
    doomed.kill()
    assert Run.objects.get(pk=run_id).status == "queued"

    crash_site.append(Worker(name="fresh"))
    wait_for(
        lambda: runs_recover_stalled()["stalled_queued"],
        timeout=20,
        what="the sweep to find the queued run",
    )
    assert wait_run(run_id, "interrupted").attempts == 1


def test_a_run_whose_pool_process_is_killed_is_run_again(crash_site):
    """Only the pool process running the run is SIGKILLed: its worker hands
    the message back from memory (reject_on_worker_lost), and the run, whose
    lease the dead process still holds, is taken over once that runs out (by
    the same worker, whose payments take 8 s: the kill lands inside the first)."""
    _, client = tenant_with_client()
    crash_site.append(
        Worker(name="doomed", env={"GATEHOUSE_DEMO_PAYMENT_LATENCY": "8"})
    )
    start_run = start(client, "refund", "crash-3", REFUND_INPUT)
    wait_run(start_run, "interrupted")
    resumed = decide(client, "crash-3")
    wait_for(
        lambda: DemoPayment.objects.filter(order_id="A-1001").exists(),
        what="the provider to record the payment",
    )
    owner = Run.objects.get(pk=resumed).lease_owner
    os.kill(int(owner.split(":")[1]), signal.SIGKILL)

    wait_for(
        lambda: runs_recover_stalled()["expired_leases"],
        timeout=20,
        what="the killed process's lease to expire",
    )
    run = wait_run(resumed, "succeeded", timeout=60)
    assert run.attempts == 2
    assert DemoPayment.objects.filter(order_id="A-1001").count() == 1


def test_a_deploy_hands_back_the_messages_its_worker_held(crash_site):
    """A warm shutdown (SIGTERM, as a deploy stops a worker) puts back what
    the worker had taken and not run: here a task due in two minutes, which
    a worker holds from when it takes it until then."""
    from celery import current_app

    from runs.dispatch import EXECUTE_RUN

    leaving = Worker(name="leaving")
    crash_site.append(leaving)
    current_app.tasks[EXECUTE_RUN].apply_async((str(uuid.uuid4()),), countdown=120)
    wait_for(lambda: not held_by_broker(), what="the worker to take the message")
    leaving.stop()
    assert leaving.process.returncode == 0
    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    assert broker.llen("celery") == 1
    broker.delete("celery")  # not for the next worker: its run is not there
