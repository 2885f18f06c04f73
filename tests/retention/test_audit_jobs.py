"""Sealing and purging the audit trail as retention jobs."""

from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone

from audit.models import AuditBlock, AuditEvent
from audit.sealing import verify_tenant
from retention.jobs import job_run
from retention.services import legal_hold_place, retention_policy_set
from tests.factories import make_tenant
from tests.retention.helpers import TESTS, make_thread

pytestmark = pytest.mark.django_db


def test_events_past_the_audit_retention_are_purged_and_the_purge_recorded():
    tenant, held = make_tenant(), make_tenant()
    for each in (tenant, held):
        retention_policy_set(
            tenant=each, actor=TESTS, checkpoint_ttl_days=1, audit_retention_days=2
        )
        make_thread(each, steps=1)
    legal_hold_place(tenant=held, reason="litigation", actor=TESTS)
    sealed = job_run("seal_audit")
    assert sealed.counts[tenant.pk]["events_sealed"] > 0
    # The seal job's own event comes after what it sealed: it waits for the next.
    sealed_through = AuditBlock.objects.for_tenant(tenant).latest("last_seq").last_seq

    with time_machine.travel(timezone.now() + timedelta(days=3)):
        report = job_run("purge_audit")

    assert report.counts[tenant.pk]["events_purged"] == sealed_through
    assert held.pk not in report.counts
    kinds = list(AuditEvent.objects.for_tenant(tenant).values_list("kind", flat=True))
    assert kinds == ["retention.job_ran", "audit.purged", "retention.job_ran"]
    assert not AuditBlock.objects.for_tenant(tenant).exists()
    job_run("seal_audit")
    assert verify_tenant(tenant_id=tenant.pk).ok
    assert AuditEvent.objects.for_tenant(held).filter(kind="thread.created").exists()
