"""The audit trail's beat jobs. Task names are stable: the beat schedule
(audit/migrations/0004_beat_schedule.py) refers to them by name."""

from __future__ import annotations

from celery import shared_task

from audit import sealing
from audit.services import audit_verify
from runs.models import Tenant

# A run that takes longer stops early; the next minute's run goes on.
SEAL_TIME_BUDGET_SECONDS = 50


@shared_task(name="audit.seal", ignore_result=True)
def seal() -> dict[str, int]:
    """Seal every tenant's new events into its hash chain."""
    report = sealing.seal_all(time_budget=SEAL_TIME_BUDGET_SECONDS)
    return {"tenants": report.tenants, "blocks": report.blocks, "events": report.events}


@shared_task(name="audit.verify", ignore_result=True)
def verify() -> dict[str, int]:
    """Recompute every tenant's chain; the admin shows the latest outcome."""
    checked = broken = 0
    for tenant in Tenant.objects.order_by("pk").iterator():
        result = audit_verify(tenant=tenant, checked_by="audit.verify task")
        checked += 1
        broken += 0 if result.ok else 1
    return {"tenants": checked, "broken": broken}
