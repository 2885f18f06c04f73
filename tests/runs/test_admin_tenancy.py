"""Tenancy admin pages: keys shown once, revoked by an action, scoped by tenant."""

import re

import pytest
from django.test import Client

from audit.models import AuditEvent
from runs.models import ApiKey
from tests.factories import (
    api_client,
    make_api_key,
    make_member,
    make_superuser,
    make_tenant,
)

pytestmark = pytest.mark.django_db


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_creating_a_key_in_the_admin_shows_its_secret_once():
    tenant = make_tenant()
    admin = logged_in(make_superuser())
    response = admin.post(
        "/admin/runs/apikey/add/",
        {"tenant": tenant.pk, "name": "billing", "scopes": ["runs", "approvals"]},
    )
    assert response.status_code == 200
    secret = re.search(r'id="api-key-secret"[^>]*>([^<]+)<', response.content.decode())[
        1
    ]
    assert "no-store" in response["Cache-Control"]
    api_key = ApiKey.objects.get(name="billing")
    assert api_key.scopes == ["approvals", "runs"] and api_key.matches(secret)
    assert api_client(secret).get("/api/v1/agents").status_code == 200
    change_page = admin.get(f"/admin/runs/apikey/{api_key.pk}/change/").content.decode()
    assert secret not in change_page
    assert secret.split(".")[1] not in str(list(ApiKey.objects.values()))


def test_revoke_action_revokes_and_audits():
    tenant = make_tenant()
    api_key, secret = make_api_key(tenant)
    admin = logged_in(make_superuser())
    admin.post(
        "/admin/runs/apikey/", {"action": "revoke", "_selected_action": [api_key.pk]}
    )
    assert api_client(secret).get("/api/v1/agents").status_code == 401
    assert (
        AuditEvent.objects.for_tenant(tenant).filter(kind="api_key.revoked").count()
        == 1
    )


def test_tenant_admin_sees_only_own_tenants_keys():
    tenant_a, tenant_b = make_tenant(), make_tenant()
    key_a, _ = make_api_key(tenant_a, name="key of a")
    key_b, _ = make_api_key(tenant_b, name="key of b")
    admin_a = logged_in(make_member(tenant_a, role="tenant_admin").user)
    listing = admin_a.get("/admin/runs/apikey/").content.decode()
    assert "key of a" in listing and "key of b" not in listing
    assert admin_a.get(f"/admin/runs/apikey/{key_b.pk}/change/").status_code in (
        302,
        404,
    )
    add_form = admin_a.get("/admin/runs/apikey/add/").content.decode()
    assert tenant_a.slug in add_form and tenant_b.slug not in add_form


def test_reviewer_cannot_manage_keys():
    tenant = make_tenant()
    reviewer = logged_in(make_member(tenant, role="reviewer").user)
    assert reviewer.get("/admin/runs/apikey/").status_code == 403
    assert reviewer.get("/admin/runs/apikey/add/").status_code == 403


def test_renaming_a_tenant_in_the_admin_is_audited():
    """Issue 16, finding 12: tenant renames in the admin left no trace."""
    tenant = make_tenant("acme")
    admin = logged_in(make_member(tenant, role="tenant_admin").user)
    response = admin.post(
        f"/admin/runs/tenant/{tenant.pk}/change/", {"slug": "acme", "name": "Evil Corp"}
    )
    assert response.status_code == 302, response.content
    event = AuditEvent.objects.for_tenant(tenant).get(kind="tenant.changed")
    assert event.summary == "tenant acme changed: name (was acme, 'Acme')"
    assert event.actor_type == "user" and event.data["name"] == "Evil Corp"
    admin.post(
        f"/admin/runs/tenant/{tenant.pk}/change/", {"slug": "acme", "name": "Evil Corp"}
    )  # no change, no event
    assert AuditEvent.objects.filter(kind="tenant.changed").count() == 1


def test_renaming_a_key_in_the_admin_is_audited():
    tenant = make_tenant()
    api_key, _ = make_api_key(tenant, name="billing")
    admin = logged_in(make_superuser())
    response = admin.post(
        f"/admin/runs/apikey/{api_key.pk}/change/", {"name": "refunds"}
    )
    assert response.status_code == 302, response.content
    event = AuditEvent.objects.for_tenant(tenant).get(kind="api_key.renamed")
    assert (
        event.summary == f"API key {api_key.prefix} renamed from 'billing' to 'refunds'"
    )
    api_key.refresh_from_db()
    assert api_key.name == "refunds"
