"""runs.execution.Leases: one thread renews the leases of the runs a worker
process holds, each every third of the lease, and stops when told."""

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from audit.services import Actor
from runs import services
from runs.execution import Leases
from runs.models import Run
from tests.factories import make_tenant

pytestmark = pytest.mark.django_db(transaction=True)


def _running_run(owner: str) -> Run:
    tenant = make_tenant()
    thread = services.thread_create(
        tenant=tenant, agent="refund", actor=Actor.system("t")
    )
    return Run.objects.create(
        tenant=tenant,
        thread=thread,
        kind="start",
        agent_version="1",
        status=Run.Status.RUNNING,
        lease_owner=owner,
        lease_until=timezone.now() + timedelta(seconds=1),
    )


def _until(predicate, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_held_runs_are_renewed_until_released(settings):
    settings.GATEHOUSE_RUN_LEASE_SECONDS = 3  # renewed every second
    first, second = _running_run("w:1"), _running_run("w:2")
    leases = Leases()
    leases.hold(first.pk, "w:1")
    leases.hold(second.pk, "w:2")

    def renewed(run) -> bool:
        row = Run.objects.get(pk=run.pk)
        return row.heartbeat_at is not None and row.lease_until > run.lease_until

    assert _until(lambda: renewed(first) and renewed(second), 3)
    leases.release(first.pk)
    time.sleep(0.2)  # a renewal under way when released may still land
    after = Run.objects.get(pk=first.pk).lease_until
    kept = Run.objects.get(pk=second.pk).lease_until
    # The other run goes on being renewed; the released one no more.
    assert _until(lambda: Run.objects.get(pk=second.pk).lease_until > kept, 3)
    assert Run.objects.get(pk=first.pk).lease_until == after
    leases.release(second.pk)


def test_a_lease_taken_over_is_no_longer_renewed(settings):
    settings.GATEHOUSE_RUN_LEASE_SECONDS = 3
    run = _running_run("another:worker")
    leases = Leases()
    leases.hold(run.pk, "w:1")
    assert _until(lambda: run.pk not in leases._held, 3)
    row = Run.objects.get(pk=run.pk)
    assert (row.lease_owner, row.heartbeat_at) == ("another:worker", None)
