"""Four eyes means two accountable people: approvals are counted by
authenticated principal, never by the name a request types."""

import pytest
from django.core.management import call_command
from rest_framework.test import APIClient

from approvals import dashboard
from approvals.models import Decision
from audit.models import AuditEvent
from runs.models import ApiKey
from tests.approvals.helpers import logged_in, waiting_request
from tests.factories import api_client, make_api_key, make_member, make_tenant

pytestmark = pytest.mark.django_db


@pytest.fixture
def tenant():
    return make_tenant()


@pytest.fixture
def high_risk(tenant):
    approval = waiting_request(tenant, amount="800.00")
    assert approval.required_approvals == 2
    return approval


def decision_url(approval) -> str:
    return f"/api/v1/approvals/{approval.pk}/decision"


def approve(client, approval, **body):
    return client.post(
        decision_url(approval), {"approved": True, **body}, format="json"
    )


def session_client(user) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def personal_client(tenant, user, scopes=("approvals",)):
    _, secret = make_api_key(tenant, list(scopes), user=user)
    return api_client(secret)


def test_a_service_key_cannot_satisfy_two_approvals_under_any_label(tenant, high_risk):
    _, secret = make_api_key(tenant, ["approvals"], name="chat bot")
    _, other_secret = make_api_key(tenant, ["approvals"], name="second bot")
    bot = api_client(secret)
    assert approve(bot, high_risk, reviewer="alice").json()["status"] == "pending"
    for client, label in [
        (bot, "alice2"),
        (bot, ""),
        (api_client(other_secret), "bob"),
    ]:
        response = approve(client, high_risk, reviewer=label)
        assert response.status_code == 409, response.content
        assert response.json()["code"] == "same_reviewer"
        assert "must come from a person" in response.json()["message"]
    high_risk.refresh_from_db()
    assert high_risk.status == "pending"
    assert Decision.objects.filter(request=high_risk).count() == 1


def test_two_personal_keys_of_two_users_satisfy_two_approvals(tenant, high_risk):
    alice = make_member(tenant, username="alice").user
    bob = make_member(tenant, username="bob").user
    first = approve(personal_client(tenant, alice), high_risk, reviewer="ignored")
    assert first.json()["status"] == "pending"
    second = approve(personal_client(tenant, bob), high_risk)
    assert second.status_code == 200, second.content
    body = second.json()
    assert body["status"] == "approved" and body["resumed_run"] is not None
    assert [(d["reviewer"], d["unverified_label"]) for d in body["decisions"]] == [
        ("alice", ""),
        ("bob", ""),
    ]
    principals = set(Decision.objects.values_list("principal", flat=True))
    assert principals == {f"user:{alice.pk}", f"user:{bob.pk}"}


def test_the_same_user_by_session_and_personal_key_counts_once(tenant, high_risk):
    alice = make_member(tenant, username="alice").user
    assert approve(session_client(alice), high_risk).json()["status"] == "pending"
    response = approve(personal_client(tenant, alice), high_risk)
    assert response.status_code == 409
    assert response.json()["code"] == "same_reviewer"
    high_risk.refresh_from_db()
    assert high_risk.status == "pending"


def test_a_service_keys_label_is_kept_as_unverified_never_as_a_person(
    tenant, high_risk
):
    api_key, secret = make_api_key(tenant, ["approvals"], name="chat bot")
    body = approve(api_client(secret), high_risk, reviewer="alice").json()
    (decision,) = body["decisions"]
    assert decision["reviewer"] == f"key {api_key.prefix}"
    assert decision["unverified_label"] == "alice"
    event = AuditEvent.objects.for_tenant(tenant).get(kind="approval.decided")
    assert event.actor_type == "api_key"
    assert event.actor_label == (
        f"key {api_key.prefix} (chat bot), unverified label alice"
    )
    assert event.summary == (
        f"refund_order approved (1 of 2) by key {api_key.prefix} "
        "(unverified label “alice”)"
    )


def test_a_personal_key_acts_within_its_owners_role(tenant):
    reviewer = make_member(tenant, role="reviewer").user
    client = personal_client(tenant, reviewer, scopes=("runs", "approvals"))
    # A reviewer reads runs but does not start them, whatever the key says.
    assert client.get("/api/v1/threads").status_code == 200
    response = client.post(
        "/api/v1/threads", {"thread_id": "t1", "agent": "echo"}, format="json"
    )
    assert response.status_code == 403
    with pytest.raises(ValueError, match="not time_travel"):
        make_api_key(tenant, ["approvals", "time_travel"], user=reviewer)


def test_a_personal_key_stops_working_when_its_membership_goes(tenant):
    from audit.services import Actor
    from runs.services import membership_remove

    membership = make_member(tenant, role="reviewer")
    client = personal_client(tenant, membership.user)
    assert client.get("/api/v1/approvals").status_code == 200
    membership_remove(membership=membership, actor=Actor.system("tests"))
    assert client.get("/api/v1/approvals").status_code == 401
    assert ApiKey.objects.get(user=membership.user).revoked_at is not None


def test_a_personal_key_is_only_for_a_member_of_its_tenant(tenant):
    outsider = make_member(make_tenant(), role="reviewer").user
    with pytest.raises(ValueError, match="not a member"):
        make_api_key(tenant, ["approvals"], user=outsider)


def test_reviewer_figures_are_grouped_by_principal(tenant):
    alice = make_member(tenant, username="alice").user
    api_key, secret = make_api_key(tenant, ["approvals"], name="bot")
    session = session_client(alice)
    personal = personal_client(tenant, alice)
    bot = api_client(secret)
    for client, label in [(session, ""), (personal, ""), (bot, "x"), (bot, "y")]:
        approval = waiting_request(tenant)
        assert approve(client, approval, reviewer=label).status_code == 200
    rows = dashboard.reviewer_stats([tenant.pk])
    assert sorted((row["reviewer_label"], row["decisions"]) for row in rows) == [
        ("alice", 2),
        (f"key {api_key.prefix}", 2),
    ]


def test_a_member_makes_and_revokes_their_own_personal_key_in_the_admin(tenant):
    alice = make_member(tenant, username="alice").user
    client = logged_in(alice)
    page = client.get("/admin/runs/apikey/personal/")
    assert page.status_code == 200
    response = client.post(
        "/admin/runs/apikey/personal/",
        {"tenant": tenant.pk, "name": "my laptop", "scopes": ["approvals"]},
    )
    assert response.status_code == 302
    shown = client.get(response["Location"])
    assert "no-store" in shown["Cache-Control"]
    key = ApiKey.objects.get(user=alice)
    assert key.kind == "personal" and key.scopes == ["approvals"]
    secret = shown.context["secret"]
    assert secret and client.get(response["Location"]).context["secret"] is None
    assert api_client(secret).get("/api/v1/approvals").status_code == 200

    refused = client.post(
        "/admin/runs/apikey/personal/",
        {"tenant": tenant.pk, "name": "more", "scopes": ["time_travel"]},
    )
    assert "not time_travel" in refused.content.decode()

    bob = make_member(tenant, username="bob").user
    url = f"/admin/runs/apikey/personal/{key.pk}/revoke/"
    assert logged_in(bob).post(url).status_code == 404  # not bob's key
    assert client.post(url).status_code == 302
    assert api_client(secret).get("/api/v1/approvals").status_code == 401


def test_create_api_key_with_a_user_makes_a_personal_key(tenant, capsys):
    make_member(tenant, username="alice")
    call_command("create_api_key", tenant=tenant.slug, scopes="approvals", user="alice")
    secret = capsys.readouterr().out.strip().splitlines()[-1]
    key = ApiKey.objects.get(prefix=secret.split(".")[0])
    assert key.kind == "personal" and key.user.username == "alice"
