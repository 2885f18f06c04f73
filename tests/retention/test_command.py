"""manage.py retention_run, and the beat schedule of every job."""

import importlib
from datetime import timedelta
from io import StringIO

import pytest
import time_machine
from django.apps import apps
from django.core.management import CommandError, call_command
from django.utils import timezone
from django_celery_beat.models import PeriodicTask

from audit.models import AuditEvent
from retention.jobs import JOBS
from runs.models import Checkpoint, Thread
from tests.factories import make_tenant
from tests.retention.helpers import make_thread

pytestmark = pytest.mark.django_db


def run(*args) -> str:
    out = StringIO()
    call_command("retention_run", *args, stdout=out)
    return out.getvalue()


def test_a_dry_run_says_what_every_job_would_do_and_changes_nothing():
    tenant = make_tenant()
    make_thread(tenant, "case-1", steps=3)
    events_before = AuditEvent.objects.count()
    with time_machine.travel(timezone.now() + timedelta(days=400)):
        output = run("--dry-run")
    for name in JOBS:
        assert f"{name} (dry run)" in output
    assert f"would expire thread {tenant.slug}/case-1 (3 checkpoints)" in output
    assert "would do: 3 checkpoints, 1 threads expired" in output
    assert Checkpoint.objects.count() == 3
    assert Thread.objects.get(thread_id="case-1").deleted_at is None
    assert AuditEvent.objects.count() == events_before


def test_without_a_job_every_job_runs_once():
    tenant = make_tenant()
    make_thread(tenant, "case-1", steps=3)
    with time_machine.travel(timezone.now() + timedelta(days=400)):
        output = run()
    for name in JOBS:
        assert f"{name}: " in output
    assert Thread.objects.get(thread_id="case-1").deleted_at is not None
    jobs = AuditEvent.objects.for_tenant(tenant).filter(kind="retention.job_ran")
    assert {"expire_threads", "seal_audit"} <= set(
        jobs.values_list("data__job", flat=True)
    )


def test_one_job_by_name_and_unknown_names_refused():
    assert "prune_checkpoints: " in run("prune_checkpoints")
    with pytest.raises(CommandError, match="unknown job"):
        run("defrag")


def test_the_beat_schedule_holds_every_job_once_even_when_registered_again():
    tasks = set(PeriodicTask.objects.values_list("task", flat=True))
    assert {job.task for job in JOBS.values()} <= tasks
    migration = importlib.import_module("retention.migrations.0003_beat_schedule")
    migration.register(apps, None)
    migration.register(apps, None)
    for job in JOBS.values():
        assert PeriodicTask.objects.filter(task=job.task).count() == 1
