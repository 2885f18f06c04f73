"""Sweeps run twice at once, and a sweep killed midway, on the real Postgres."""

import os
import subprocess
import sys
import threading
from collections import Counter
from datetime import timedelta

import pytest
import time_machine
from django.db import connection
from django.utils import timezone

from approvals.models import ApprovalRequest
from audit.models import AuditEvent
from retention import services
from retention.jobs import job_run
from retention.models import DeletionRequest, ThreadRemoval
from retention.services import subject_deletion_request
from runs.crypto import ThreadCipher
from runs.models import Checkpoint, Thread
from tests import workers
from tests.factories import make_tenant
from tests.retention.helpers import TESTS, make_thread

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _only_the_sweeps_under_test(monkeypatch):
    """A deletion request also queues its own carry-out task; a worker that
    the session started for other tests would take it. Here only the sweeps
    under test may carry requests out."""
    monkeypatch.setattr(services, "_schedule_carry_out", lambda request_pk: None)


LATER = timedelta(days=400)


def at_once(job: str, *, sweepers: int = 2, batch_size: int = 7) -> list:
    """Run `job` in `sweepers` threads (one connection each), started together."""
    barrier = threading.Barrier(sweepers)
    reports, errors = [], []

    def sweep() -> None:
        try:
            barrier.wait()
            reports.append(job_run(job, batch_size=batch_size))
        except Exception as exc:  # surfaced by the assertion below
            errors.append(exc)
        finally:
            connection.close()

    workers = [threading.Thread(target=sweep) for _ in range(sweepers)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
    assert not errors, errors
    return reports


def tombstones(tenant) -> Counter:
    return Counter(
        AuditEvent.objects.for_tenant(tenant)
        .filter(kind="thread.deleted")
        .values_list("thread_id", flat=True)
    )


def test_two_expiry_sweeps_at_once_remove_each_thread_once():
    tenant = make_tenant()
    threads = [make_thread(tenant, f"t{n}", steps=2) for n in range(60)]
    with time_machine.travel(timezone.now() + LATER):
        reports = at_once("expire_threads")
    assert sum(r.totals["threads_expired"] for r in reports) == 60
    assert sum(r.totals["checkpoints"] for r in reports) == 120
    assert ThreadRemoval.objects.count() == 60
    assert tombstones(tenant) == Counter({t.thread_id: 1 for t in threads})
    assert not Checkpoint.objects.exists()


def test_two_deletion_sweeps_at_once_complete_each_request_once():
    tenant = make_tenant()
    requests = []
    for n in range(12):
        for m in range(3):
            make_thread(tenant, f"s{n}-{m}", steps=1, subject=f"subject-{n}")
        requests.append(
            subject_deletion_request(tenant=tenant, subject=f"subject-{n}", actor=TESTS)
        )
    reports = at_once("carry_out_deletions", batch_size=2)
    assert sum(r.totals["threads_removed"] for r in reports) == 36
    assert sum(r.totals["requests_completed"] for r in reports) == 12
    for request in requests:
        request.refresh_from_db()
        assert request.status == "completed" and request.record["threads_removed"] == 3
    assert set(tombstones(tenant).values()) == {1} and len(tombstones(tenant)) == 36
    completed = AuditEvent.objects.for_tenant(tenant).filter(kind="deletion.completed")
    assert completed.count() == 12


def test_two_escalation_sweeps_at_once_take_each_hop_once():
    tenant = make_tenant()
    for n in range(30):
        thread = make_thread(tenant, f"a{n}", steps=0)
        Thread.objects.filter(pk=thread.pk).update(status="interrupted")
    due = timezone.now()
    ApprovalRequest.objects.update(due_at=due)
    with time_machine.travel(due + timedelta(minutes=5)):
        reports = at_once("escalate_approvals", sweepers=3, batch_size=4)
    assert sum(r.totals["step_remind"] for r in reports) == 30
    reminded = AuditEvent.objects.for_tenant(tenant).filter(kind="approval.escalated")
    assert reminded.count() == 30
    assert set(ApprovalRequest.objects.values_list("escalation_level", flat=True)) == {
        1
    }


# --- killed midway ------------------------------------------------------------------

CRASHING_SWEEP = """
import os, sys
import django
django.setup()
import time_machine
from datetime import datetime
from retention import jobs, services

job, when, crash_at = sys.argv[1], datetime.fromisoformat(sys.argv[2]), int(sys.argv[3])
calls = 0
record_tombstone = services.thread_tombstone_record


def crash_midway(**kwargs):
    global calls
    calls += 1
    event = record_tombstone(**kwargs)
    if calls == crash_at:
        os._exit(9)  # a real crash: no rollback, no cleanup, connection dropped
    return event


services.thread_tombstone_record = crash_midway
with time_machine.travel(when):
    jobs.job_run(job, batch_size=10)
"""


def crash_a_sweep(job: str, *, when, crash_at: int) -> None:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": workers.suite_database_url(),
    }
    finished = subprocess.run(
        [sys.executable, "-c", CRASHING_SWEEP, job, when.isoformat(), str(crash_at)],
        cwd=workers.ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert finished.returncode == 9, finished.stderr


def removed_or_intact(thread: Thread) -> str:
    """'removed' or 'intact'; anything in between is an inconsistent state."""
    thread.refresh_from_db()
    rows = Checkpoint.objects.filter(thread=thread).count()
    removal = ThreadRemoval.objects.filter(thread=thread).exists()
    if removal and rows == 0 and thread.wrapped_data_key is None:
        return "removed"
    if not removal and rows == 2 and thread.deleted_at is None:
        ThreadCipher.for_thread(thread)
        return "intact"
    return "inconsistent"


def test_an_expiry_sweep_killed_midway_leaves_a_state_the_next_one_completes():
    tenant = make_tenant()
    threads = [make_thread(tenant, f"t{n:02}", steps=2) for n in range(25)]
    when = timezone.now() + LATER

    crash_a_sweep("expire_threads", when=when, crash_at=15)

    states = Counter(removed_or_intact(thread) for thread in threads)
    # The first batch of 10 committed; the crash rolled the second back whole.
    assert states == {"removed": 10, "intact": 15}
    assert sum(tombstones(tenant).values()) == 10
    with time_machine.travel(when):
        assert job_run("expire_threads").totals["threads_expired"] == 15
    assert Counter(removed_or_intact(thread) for thread in threads) == {"removed": 25}
    assert tombstones(tenant) == Counter({t.thread_id: 1 for t in threads})


def test_a_deletion_sweep_killed_midway_leaves_a_state_the_next_one_completes():
    tenant = make_tenant()
    for n in range(25):
        make_thread(tenant, f"s{n:02}", steps=2, subject="jane")
    request = subject_deletion_request(tenant=tenant, subject="jane", actor=TESTS)

    crash_a_sweep("carry_out_deletions", when=timezone.now(), crash_at=15)

    request.refresh_from_db()
    assert request.status == "shredded"
    assert request.record["threads_removed"] == 10
    assert ThreadRemoval.objects.filter(deletion_request=request).count() == 10
    assert Checkpoint.objects.count() == 15 * 2
    assert not Thread.objects.filter(wrapped_data_key__isnull=False).exists()

    job_run("carry_out_deletions")
    request.refresh_from_db()
    assert request.status == "completed"
    assert request.record["threads_removed"] == 25
    assert request.record["removed"]["checkpoints"] == 50
    assert not Checkpoint.objects.exists()
    assert set(tombstones(tenant).values()) == {1} and len(tombstones(tenant)) == 25
    assert DeletionRequest.objects.get().status == "completed"
