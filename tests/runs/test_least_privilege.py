"""Tenant admins manage members, keys and policies, and nothing else; the
admin shows a user only their own tenants and those tenants' members."""

import pytest
from django.test import Client

from audit.services import Actor
from runs import services
from runs.models import ApiKey, Membership
from tests.factories import make_member, make_superuser, make_tenant

pytestmark = pytest.mark.django_db


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_a_tenant_admin_cannot_read_decrypted_state_over_the_api():
    tenant = make_tenant()
    services.thread_create(
        tenant=tenant, agent="echo", thread_id="t1", actor=Actor.system("t")
    )
    admin = logged_in(make_member(tenant, role="tenant_admin").user)
    reviewer = logged_in(make_member(tenant, role="reviewer").user)

    refused = admin.get("/api/v1/threads/t1/state")
    assert refused.status_code == 403
    assert refused.json()["code"] == "permission_denied"
    assert reviewer.get("/api/v1/threads/t1/state").status_code == 404  # no state yet


def test_a_tenant_admin_cannot_change_or_remove_their_own_membership():
    tenant = make_tenant()
    own = make_member(tenant, role="tenant_admin")
    admin = logged_in(own.user)

    changed = admin.post(
        f"/admin/runs/membership/{own.pk}/change/",
        {"tenant": tenant.pk, "user": own.user.pk, "role": "compliance_officer"},
    )
    added = admin.post(
        "/admin/runs/membership/add/",
        {"tenant": tenant.pk, "user": own.user.pk, "role": "compliance_officer"},
    )
    removed = admin.post(f"/admin/runs/membership/{own.pk}/delete/", {"post": "yes"})

    assert changed.status_code == 403 and removed.status_code == 403
    assert added.status_code in (200, 403)  # refused, form shown again or denied
    assert Membership.objects.get(pk=own.pk).role == "tenant_admin"


def test_a_tenant_admin_cannot_issue_a_key_with_a_scope_their_role_lacks():
    tenant = make_tenant()
    admin = logged_in(make_member(tenant, role="tenant_admin").user)

    for scope in ("approvals", "time_travel"):
        response = admin.post(
            "/admin/runs/apikey/add/",
            {"tenant": tenant.pk, "name": f"with {scope}", "scopes": [scope]},
        )
        assert response.status_code == 200 and "errorlist" in response.content.decode()
    allowed = admin.post(
        "/admin/runs/apikey/add/",
        {"tenant": tenant.pk, "name": "runs only", "scopes": ["runs"]},
    )

    assert allowed.status_code == 302
    assert list(ApiKey.objects.values_list("name", "scopes")) == [
        ("runs only", ["runs"])
    ]


def test_admin_filters_and_user_choices_show_only_own_tenants_and_members():
    mine, theirs = make_tenant("mine"), make_tenant("theirs")
    admin = logged_in(make_member(mine, role="tenant_admin").user)
    colleague = make_member(mine, role="reviewer", username="colleague")
    stranger = make_member(theirs, role="reviewer", username="stranger")
    make_superuser(username="root")

    for page in ("/admin/runs/membership/", "/admin/runs/apikey/"):
        html = admin.get(page).content.decode()
        assert "?tenant=" in html and "theirs" not in html, page
    form = admin.get("/admin/runs/membership/add/").content.decode()
    assert colleague.user.username in form
    assert stranger.user.username not in form and "root" not in form
