"""Celery tasks of the retention jobs. Thin: the work is in retention.jobs.

Task names are stable: the beat schedule (retention/migrations/
0003_beat_schedule.py, 0004_beat_idempotency_purge.py) refers to them by
name. Two jobs run under their
owners' tasks, `runs.recover_stalled_runs` and `audit.seal`, which beat runs
more often than a retention job would; `manage.py retention_run` runs them
through retention.jobs like the others.
"""

from __future__ import annotations

from celery import shared_task
from django.conf import settings

from retention import jobs, services
from retention.models import DeletionRequest


def _scheduled(name: str) -> dict[str, int]:
    report = jobs.job_run(
        name, time_budget=settings.GATEHOUSE_RETENTION_TIME_BUDGET_SECONDS
    )
    return dict(report.totals)


@shared_task(name="retention.expire_threads", ignore_result=True)
def expire_threads() -> dict[str, int]:
    return _scheduled("expire_threads")


@shared_task(name="retention.prune_checkpoints", ignore_result=True)
def prune_checkpoints() -> dict[str, int]:
    return _scheduled("prune_checkpoints")


@shared_task(name="retention.escalate_approvals", ignore_result=True)
def escalate_approvals() -> dict[str, int]:
    return _scheduled("escalate_approvals")


@shared_task(name="retention.close_orphaned_approvals", ignore_result=True)
def close_orphaned_approvals() -> dict[str, int]:
    return _scheduled("close_orphaned_approvals")


@shared_task(name=services.CARRY_OUT_DELETIONS, ignore_result=True)
def carry_out_deletions() -> dict[str, int]:
    return _scheduled("carry_out_deletions")


@shared_task(name="retention.purge_audit", ignore_result=True)
def purge_audit() -> dict[str, int]:
    return _scheduled("purge_audit")


@shared_task(name="retention.purge_idempotency_records", ignore_result=True)
def purge_idempotency_records() -> dict[str, int]:
    return _scheduled("purge_idempotency_records")


@shared_task(name=services.CARRY_OUT_DELETION, acks_late=True, ignore_result=True)
def carry_out_deletion(request_id: str) -> None:
    """Carry out one request right after it was accepted (the beat job is the
    safety net: a lost message only delays the removal)."""
    request = DeletionRequest.objects.filter(pk=request_id).first()
    while request is not None:
        step = services.deletion_carry_out(
            request=request, batch_size=settings.GATEHOUSE_RETENTION_BATCH_SIZE
        )
        if step is None or not step.removed or not step.request.is_open:
            return
        request = step.request
