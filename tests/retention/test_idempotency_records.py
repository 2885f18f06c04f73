"""Idempotency-Key records are purged past GATEHOUSE_IDEMPOTENCY_TTL by a
retention job that beat runs; before, only a request reusing the same key
deleted an expired record, so the rest (with the responses sealed in them)
stayed for good."""

from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone
from django_celery_beat.models import PeriodicTask

from audit.models import AuditEvent
from retention.jobs import JOBS, job_run
from runs.models import IdempotencyRecord
from tests.factories import make_tenant

pytestmark = pytest.mark.django_db


def _record(tenant, key: str, age: timedelta) -> IdempotencyRecord:
    return IdempotencyRecord.objects.create(
        tenant=tenant, owner="api_key:1", key=key, method="POST",
        path="/api/v1/threads", request_digest="0" * 64, response_status=201,
        response_sealed=b"sealed", created_at=timezone.now() - age,
    )  # fmt: skip


def test_records_past_the_ttl_are_purged_and_younger_ones_kept():
    ttl = settings.GATEHOUSE_IDEMPOTENCY_TTL
    tenant, other = make_tenant(), make_tenant()
    for index in range(3):
        _record(tenant, f"old-{index}", ttl + timedelta(minutes=1 + index))
    _record(other, "old", ttl + timedelta(days=300))
    young = _record(tenant, "young", ttl - timedelta(minutes=5))

    plan = job_run("purge_idempotency_records", dry_run=True)
    assert plan.counts[tenant.pk]["idempotency_records"] == 3
    assert IdempotencyRecord.objects.count() == 5  # a dry run changes nothing

    report = job_run("purge_idempotency_records")
    assert report.counts[tenant.pk]["idempotency_records"] == 3
    assert report.counts[other.pk]["idempotency_records"] == 1
    assert list(IdempotencyRecord.objects.values_list("pk", flat=True)) == [young.pk]
    # Each tenant's trail has its own count.
    ran = AuditEvent.objects.for_tenant(other).get(kind="retention.job_ran")
    assert ran.data["job"] == "purge_idempotency_records"
    assert ran.data["idempotency_records"] == 1
    assert not job_run("purge_idempotency_records").counts


def test_beat_runs_the_purge():
    job = JOBS["purge_idempotency_records"]
    entry = PeriodicTask.objects.get(name=job.task)
    assert entry.task == job.task and entry.enabled
    assert entry.interval.every == 3600
