"""Which tenants have webhook subscriptions, as each process keeps it under
the subscriptions' epoch in Redis (webhooks.services): a commit whose tenant
has no subscription that wants its events reads none, and a subscription
made or deleted in any process is seen by the next commit. Without Redis
(the embedded mode) nothing is kept: every commit reads them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.conf import settings as django_settings
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from audit import events
from audit.services import Actor, record
from tests.factories import tenant_with_client
from tests.workers import ROOT, suite_database_url
from webhooks.models import WebhookDelivery
from webhooks.services import SUBSCRIPTIONS_EPOCH

pytestmark = pytest.mark.django_db(transaction=True)

HOOK = "https://hooks.example.com/gh"


@pytest.fixture
def redis_cache(settings):
    """The suite's Redis as the cache, as a second process gets it from
    CACHE_URL: with no key prefix (django-environ passes one to Django's
    Redis backend as an option it ignores). The epoch is a random token: a
    test that replaces it makes other processes read again, nothing worse."""
    settings.CACHES = {
        "default": {
            "BACKEND": "runs.cache.RedisCache",
            "LOCATION": django_settings.CELERY_BROKER_URL,
        }
    }
    SUBSCRIPTIONS_EPOCH.renew()
    yield
    SUBSCRIPTIONS_EPOCH.renew()


def _commit(tenant, kind=events.RUN_FAILED) -> int:
    """One event committed in a transaction of its own: how many statements
    its announcement read the tenant's subscriptions with."""
    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        record(
            tenant=tenant,
            kind=kind,
            actor=Actor.system("tests"),
            action="refund",
            data={"error_type": "Boom", "risk": "low"},
        )
    return sum('"webhooks_webhooksubscription"' in q["sql"] for q in queries)


def _deliveries(tenant) -> int:
    return WebhookDelivery.objects.filter(tenant=tenant).count()


def _subscribe(client, wanted: list[str]) -> str:
    response = client.post(
        "/api/v1/webhooks", {"url": HOOK, "events": wanted}, format="json"
    )
    assert response.status_code == 201, response.content
    return response.json()["id"]


def test_a_tenant_without_subscriptions_is_read_once(redis_cache):
    tenant, _ = tenant_with_client()
    assert _commit(tenant) == 1
    assert _commit(tenant) == 0
    assert _commit(tenant, events.APPROVAL_REQUESTED) == 0
    assert _deliveries(tenant) == 0


def test_subscribing_and_unsubscribing_are_seen_at_the_next_commit(redis_cache):
    tenant, client = tenant_with_client()
    assert _commit(tenant) == 1
    assert _commit(tenant) == 0
    subscription_id = _subscribe(client, [events.RUN_FAILED.name])
    assert _commit(tenant) == 1
    assert _deliveries(tenant) == 1
    response = client.delete(f"/api/v1/webhooks/{subscription_id}")
    assert response.status_code == 204
    assert _commit(tenant) == 1
    assert _commit(tenant) == 0
    assert _deliveries(tenant) == 1


def test_events_no_subscription_wants_read_nothing(redis_cache):
    tenant, client = tenant_with_client()
    _subscribe(client, [events.APPROVAL_REQUESTED.name])
    assert _commit(tenant) == 1
    assert _commit(tenant) == 0
    assert _deliveries(tenant) == 0
    # An event a subscription wants: its rows are read, its delivery queued.
    assert _commit(tenant, events.APPROVAL_REQUESTED) == 1
    assert _deliveries(tenant) == 1


def test_a_subscription_made_in_another_process_is_seen(redis_cache):
    """A second process (its own Python, the same database and Redis)
    subscribes the tenant while this one keeps that it has none."""
    tenant, _ = tenant_with_client()
    assert _commit(tenant) == 1
    assert _commit(tenant) == 0
    broker = django_settings.CELERY_BROKER_URL
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import django; django.setup()\n"
            "from audit.services import Actor\n"
            "from runs.models import Tenant\n"
            "from webhooks import services\n"
            "services.subscription_create(\n"
            f"    tenant=Tenant.objects.get(pk={tenant.pk}), url={HOOK!r},\n"
            f"    events_wanted=[{events.RUN_FAILED.name!r}],\n"
            "    actor=Actor.system('another process'),\n"
            ")\n",
        ],
        cwd=ROOT,
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "DATABASE_URL": suite_database_url(),
            "CACHE_URL": broker.replace("redis://", "rediscache://", 1),
        },
        check=True,
        timeout=120,
    )
    assert _commit(tenant) == 1
    assert _deliveries(tenant) == 1


def test_a_bulk_delete_of_subscriptions_is_seen(redis_cache):
    """A queryset's delete (as a tenant's deletion cascades) sends each row's
    post_delete, so it replaces the epoch as the service's delete does."""
    from webhooks.models import WebhookSubscription

    tenant, client = tenant_with_client()
    _subscribe(client, [events.RUN_FAILED.name])
    assert _commit(tenant) == 1
    before = SUBSCRIPTIONS_EPOCH.current()
    WebhookSubscription.objects.filter(tenant=tenant).delete()
    assert SUBSCRIPTIONS_EPOCH.current() != before
    assert _commit(tenant) == 1
    assert _deliveries(tenant) == 1


def test_without_redis_every_commit_reads_the_subscriptions(settings):
    """The embedded mode's cache (locmem) is the process's own: another
    process's subscription could not be seen, so nothing is kept."""
    settings.CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
    }
    tenant, client = tenant_with_client()
    assert SUBSCRIPTIONS_EPOCH.current() is None
    assert _commit(tenant) == 1
    assert _commit(tenant) == 1
    _subscribe(client, [events.RUN_FAILED.name])
    assert _commit(tenant) == 1
    assert _deliveries(tenant) == 1


def test_a_cache_outage_loses_no_delivery(redis_cache, settings):
    """With the cache's Redis unreachable the subscriptions' epoch cannot be
    read: nothing is kept and the subscriptions are read from Postgres, so a
    delivery is written as without Redis. Raising instead would lose it: the
    receivers are called robustly (an error is only logged)."""
    tenant, client = tenant_with_client()
    _subscribe(client, [events.RUN_FAILED.name])
    reachable = settings.CACHES
    settings.CACHES = {
        "default": {
            "BACKEND": "runs.cache.RedisCache",
            "LOCATION": "redis://127.0.0.1:1/0",
        }
    }
    try:
        assert _commit(tenant) == 1
        assert _deliveries(tenant) == 1
        assert SUBSCRIPTIONS_EPOCH.current() is None
    finally:
        settings.CACHES = reachable  # for the fixture's renew() at teardown
