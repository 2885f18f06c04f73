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
from retention.selectors import subject_threads
from retention.services import retention_policy_set, subject_deletion_request
from runs.models import Thread
from tests.factories import make_tenant
from tests.retention.helpers import TESTS, make_thread
from webhooks.models import WebhookDelivery

pytestmark = pytest.mark.django_db

ROWS = 70_000  # more than 65535: one parameter per row would not fit
SUBJECT = "jane.doe@example.com"


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


def test_a_subject_with_70k_threads_is_deleted():
    """Its threads locked by a subquery and closed in batches: never one
    parameter per thread in a statement."""
    tenant = make_tenant()
    first = make_thread(tenant, "s-0", steps=1, subject=SUBJECT, with_content=False)
    columns = [
        f.column
        for f in Thread._meta.concrete_fields
        if f.column not in ("id", "thread_id")
    ]
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO runs_thread (thread_id, {', '.join(columns)}) "
            f"SELECT 's-' || i, {', '.join(columns)} FROM runs_thread, "
            "generate_series(1, %s) i WHERE id = %s",
            [ROWS - 1, first.pk],
        )

    request = subject_deletion_request(tenant=tenant, subject=SUBJECT, actor=TESTS)

    assert request.status == "shredded"
    assert request.record["threads_shredded"] == ROWS
    assert not subject_threads(tenant, SUBJECT).exists()
    assert not Thread.objects.filter(
        tenant=tenant, wrapped_data_key__isnull=False
    ).exists()
