"""Tenancy admin pages: keys shown once, revoked by an action, scoped by tenant."""

import re

import pytest
from django.contrib.sessions.models import Session
from django.db import IntegrityError, transaction
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


SECRET = re.compile(r'id="api-key-secret"[^>]*>([^<]+)<')


def test_creating_a_key_redirects_to_a_page_that_shows_its_secret_once():
    tenant = make_tenant()
    admin = logged_in(make_superuser())
    response = admin.post(
        "/admin/runs/apikey/add/",
        {"tenant": tenant.pk, "name": "billing", "scopes": ["runs", "approvals"]},
    )
    api_key = ApiKey.objects.get(name="billing")
    assert response.status_code == 302
    assert response["Location"].startswith(f"/admin/runs/apikey/{api_key.pk}/created/")
    # The redirect carries only the one-time key; the secret is not in the URL.
    assert api_key.prefix not in response["Location"]

    shown = admin.get(response["Location"])
    assert "no-store" in shown["Cache-Control"]
    secret = SECRET.search(shown.content.decode())[1]
    assert api_key.scopes == ["approvals", "runs"] and api_key.matches(secret)
    assert "Scopes: Approvals, Runs" in shown.content.decode()
    assert api_client(secret).get("/api/v1/agents").status_code == 200

    # Reloading shows it no more, and makes no other key.
    again = admin.get(response["Location"])
    assert again.status_code == 200 and secret not in again.content.decode()
    assert "cannot be shown again" in again.content.decode()
    assert ApiKey.objects.count() == 1
    change_page = admin.get(f"/admin/runs/apikey/{api_key.pk}/change/").content.decode()
    assert secret not in change_page
    stored = str(list(ApiKey.objects.values())) + str(
        list(Session.objects.values_list("session_data", flat=True))
    )
    assert secret.split(".")[1] not in stored


def test_the_created_page_needs_both_the_session_and_the_url():
    tenant = make_tenant()
    admin = logged_in(make_superuser())
    location = admin.post(
        "/admin/runs/apikey/add/",
        {"tenant": tenant.pk, "name": "billing", "scopes": ["runs"]},
    )["Location"]
    # Another staff user with the URL: not their session, nothing to show.
    other = logged_in(make_member(tenant, role="tenant_admin").user)
    assert not SECRET.search(other.get(location).content.decode())
    # The creator without the URL's key: nothing shown, and it is gone.
    url = location.split("?")[0]
    assert not SECRET.search(admin.get(url + "?k=AAAA").content.decode())
    assert not SECRET.search(admin.get(location).content.decode())


def test_key_names_are_unique_in_a_tenant_and_not_empty():
    tenant, elsewhere = make_tenant(), make_tenant()
    make_api_key(tenant, name="billing")
    make_api_key(elsewhere, name="billing")  # another tenant may use it
    admin = logged_in(make_superuser())
    for name, error in [("billing", "already has a key named"), ("   ", "required")]:
        response = admin.post(
            "/admin/runs/apikey/add/",
            {"tenant": tenant.pk, "name": name, "scopes": ["runs"]},
        )
        assert response.status_code == 200
        assert error in response.content.decode()
    assert ApiKey.objects.filter(tenant=tenant).count() == 1

    other, _ = make_api_key(tenant, name="reports")
    renamed = admin.post(
        f"/admin/runs/apikey/{other.pk}/change/", {"name": " billing "}
    )
    assert renamed.status_code == 200
    assert "already has a key named" in renamed.content.decode()
    assert (
        admin.post(
            f"/admin/runs/apikey/{other.pk}/change/", {"name": "reports v2"}
        ).status_code
        == 302
    )
    other.refresh_from_db()
    assert other.name == "reports v2"


def test_the_database_refuses_a_duplicate_or_empty_name():
    tenant = make_tenant()
    api_key, _ = make_api_key(tenant, name="billing")
    for name in ["billing", ""]:
        with pytest.raises(IntegrityError), transaction.atomic():
            ApiKey.objects.create(
                tenant=tenant, name=name, prefix="gh_x" + name[:3], scopes=["runs"]
            )


def test_the_add_form_starts_on_the_tenant_admins_only_tenant():
    tenant = make_tenant()
    make_tenant()
    admin_a = logged_in(make_member(tenant, role="tenant_admin").user)
    page = admin_a.get("/admin/runs/apikey/add/").content.decode()
    assert f'<option value="{tenant.pk}" selected>' in page


def test_scopes_are_listed_as_words():
    tenant = make_tenant()
    make_api_key(tenant, scopes=["runs", "time_travel"])
    listing = logged_in(make_superuser()).get("/admin/runs/apikey/").content.decode()
    assert "Runs, Time travel" in listing and "time_travel" not in listing


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


def test_keys_made_in_two_tabs_each_show_their_secret_once():
    tenant = make_tenant()
    admin = logged_in(make_superuser())
    locations = [
        admin.post(
            "/admin/runs/apikey/add/",
            {"tenant": tenant.pk, "name": name, "scopes": ["runs"]},
        )["Location"]
        for name in ("first", "second")
    ]
    for location, name in zip(locations, ("first", "second"), strict=True):
        secret = SECRET.search(admin.get(location).content.decode())[1]
        assert ApiKey.objects.get(name=name).matches(secret)
        assert not SECRET.search(admin.get(location).content.decode())


@pytest.mark.parametrize(
    "query",
    [
        "occurred_at__day=30&occurred_at__month=2&occurred_at__year=2026",
        "occurred_at__gte=2026-02-30",
        "occurred_at__year=abc",
    ],
)
def test_a_filter_that_cannot_apply_is_said_so_not_a_500(query):
    admin = logged_in(make_superuser())
    response = admin.get(f"/admin/audit/auditevent/?{query}", follow=True)
    assert response.status_code == 200
    assert response.redirect_chain[-1][0].endswith("?e=1")
    assert "A filter in the address was not valid" in response.content.decode()
