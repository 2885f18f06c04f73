"""/api/v1/webhooks: a tenant's subscriptions, validated, tenant-scoped."""

from __future__ import annotations

import pytest
from django.test import override_settings

from audit.models import AuditEvent
from tests.factories import tenant_with_client
from webhooks.models import WebhookSubscription

pytestmark = pytest.mark.django_db


def test_a_subscription_shows_its_secret_once_and_stores_it_wrapped():
    tenant, client = tenant_with_client()
    response = client.post(
        "/api/v1/webhooks",
        {"url": "https://hooks.example.com/gh", "events": ["run.failed"]},
        format="json",
    )
    assert response.status_code == 201
    secret = response.json()["secret"]
    assert secret.startswith("whsec_")
    subscription = WebhookSubscription.objects.get(tenant=tenant)
    assert secret.removeprefix("whsec_").encode() not in bytes(
        subscription.wrapped_secret
    )
    listed = client.get("/api/v1/webhooks").json()["results"]
    assert [item["id"] for item in listed] == [str(subscription.pk)]
    assert "secret" not in listed[0]
    assert AuditEvent.objects.filter(tenant=tenant, kind="webhook.subscribed").exists()


@override_settings(GATEHOUSE_WEBHOOK_ALLOW_PRIVATE=False)
@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9000/hook",
        "http://localhost/hook",
        "http://10.1.2.3/hook",
        "http://[::1]/hook",
        "http://169.254.169.254/latest",
        "ftp://hooks.example.com/x",
        "https://user:pw@hooks.example.com/x",
    ],
)
def test_loopback_private_and_odd_urls_are_refused(url):
    _, client = tenant_with_client()
    response = client.post(
        "/api/v1/webhooks", {"url": url, "events": []}, format="json"
    )
    assert response.status_code == 400
    assert "url" in response.json()["fields"]


def test_unknown_events_are_refused_naming_the_field():
    _, client = tenant_with_client()
    response = client.post(
        "/api/v1/webhooks",
        {"url": "https://hooks.example.com", "events": ["run.exploded"]},
        format="json",
    )
    assert response.status_code == 400 and "events" in response.json()["fields"]


def test_another_tenants_subscription_is_404():
    _, owner = tenant_with_client()
    created = owner.post(
        "/api/v1/webhooks",
        {"url": "https://hooks.example.com", "events": []},
        format="json",
    ).json()
    _, stranger = tenant_with_client()
    for method in (stranger.get, stranger.delete):
        assert method(f"/api/v1/webhooks/{created['id']}").status_code == 404
    assert (
        stranger.get(f"/api/v1/webhooks/{created['id']}/deliveries").status_code == 404
    )
    assert owner.get(f"/api/v1/webhooks/{created['id']}").status_code == 200


def test_a_key_without_the_runs_scope_cannot_subscribe():
    _, client = tenant_with_client(scopes=["approvals"])
    response = client.post(
        "/api/v1/webhooks",
        {"url": "https://hooks.example.com", "events": []},
        format="json",
    )
    assert response.status_code == 403


def test_rotating_the_master_key_rewraps_the_signing_secret_unchanged():
    from django.core.management import call_command

    from tests.runs.test_checkpointer import NEW, OLD
    from webhooks import services

    with override_settings(GATEHOUSE_MASTER_KEYS=OLD):
        tenant, _ = tenant_with_client()
        issued = services.subscription_create(
            tenant=tenant,
            url="https://hooks.example.com",
            events_wanted=[],
            actor=services.Actor.system("tests"),
        )
    with override_settings(GATEHOUSE_MASTER_KEYS=f"{NEW},{OLD}"):
        call_command("rotate_master_key", verbosity=0)
    with override_settings(GATEHOUSE_MASTER_KEYS=NEW):
        subscription = WebhookSubscription.objects.get(pk=issued.subscription.pk)
        assert subscription.secret_key_id == "new"
        assert services.secret_text(subscription) == issued.secret
