"""A thread whose content spans more rows than a statement may take
parameters (65535 with server-side binding): removing it must work, and must
not hold up the threads expiring after it."""

from __future__ import annotations

from datetime import timedelta

import pytest
import time_machine
from django.db import connection
from django.utils import timezone

from retention.jobs import job_run
from retention.services import retention_policy_set
from tests.factories import make_tenant
from tests.retention.helpers import TESTS, make_thread
from webhooks.models import WebhookDelivery

pytestmark = pytest.mark.django_db

ROWS = 70_000  # more than 65535: one parameter per row would not fit


def _deliveries(thread, rows: int) -> None:
    """`rows` delivered webhooks of the thread (each a sealed body: content)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {WebhookDelivery._meta.db_table} (id, tenant_id, "
            "thread_id, event_type, target, sealed_body, status, attempts, "
            "last_error, next_attempt_at, created_at) "
            "SELECT gen_random_uuid(), %s, %s, 'run.succeeded', 'https://x', "
            "'\\x00'::bytea, 'delivered', 1, '', now(), now() "
            "FROM generate_series(1, %s)",
            [thread.tenant_id, thread.pk, rows],
        )


def test_a_thread_with_70k_webhook_bodies_expires_and_the_next_tenant_too():
    big_tenant, other = make_tenant(), make_tenant()
    for tenant in (big_tenant, other):
        retention_policy_set(tenant=tenant, actor=TESTS, checkpoint_ttl_days=30)
    big = make_thread(big_tenant, "big", steps=1)
    small = make_thread(other, "small", steps=1)
    _deliveries(big, ROWS)

    with time_machine.travel(timezone.now() + timedelta(days=31), tick=False):
        job_run("expire_threads", batch_size=2)

    big.refresh_from_db()
    small.refresh_from_db()
    assert big.deleted_at is not None and small.deleted_at is not None
    kept = WebhookDelivery.objects.filter(thread=big)
    assert kept.count() == ROWS  # deliveries stay, their bodies go
    assert not kept.exclude(sealed_body=None).exists()
    assert big.removal.removed["webhook_bodies"] == ROWS
