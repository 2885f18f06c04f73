"""Operators' commands for tenants, keys and reviewers."""

import io
import threading

import pytest
from django.contrib.auth import authenticate
from django.core.management import CommandError, call_command
from django.db import connection, transaction
from django.test import RequestFactory

from audit.models import AuditEvent
from runs import services
from runs.models import ApiKey, Membership, Tenant
from tests.factories import api_client, make_api_key
from tests.workers import wait_for

pytestmark = pytest.mark.django_db


def run(*args) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def test_create_tenant_records_an_audit_event():
    run("create_tenant", "acme", "--name", "Acme Corp")
    tenant = Tenant.objects.get(slug="acme")
    assert tenant.name == "Acme Corp"
    assert (
        AuditEvent.objects.for_tenant(tenant).filter(kind="tenant.created").count() == 1
    )


def test_create_tenant_twice_is_an_error():
    run("create_tenant", "acme")
    with pytest.raises(CommandError, match="already exists"):
        run("create_tenant", "acme")


def test_create_api_key_prints_a_working_secret_on_its_last_line():
    run("create_tenant", "acme")
    output = run("create_api_key", "--tenant", "acme", "--scopes", "runs,audit")
    secret = output.strip().splitlines()[-1]
    api_key = ApiKey.objects.get(prefix=secret.split(".")[0])
    assert api_key.scopes == ["audit", "runs"]
    assert secret not in api_key.secret_hash and api_key.matches(secret)
    assert api_client(secret).get("/api/v1/agents").status_code == 200


def test_create_api_key_rejects_unknown_scope():
    run("create_tenant", "acme")
    with pytest.raises(CommandError, match="scopes"):
        run("create_api_key", "--tenant", "acme", "--scopes", "runs,root")


def test_create_api_key_for_missing_tenant_is_an_error():
    with pytest.raises(CommandError, match="no tenant"):
        run("create_api_key", "--tenant", "ghost", "--scopes", "runs")


def test_revoke_api_key_stops_it_working():
    run("create_tenant", "acme")
    secret = run("create_api_key", "--tenant", "acme", "--scopes", "runs").split()[-1]
    run("revoke_api_key", secret.split(".")[0])
    assert api_client(secret).get("/api/v1/agents").status_code == 401
    tenant = Tenant.objects.get(slug="acme")
    assert AuditEvent.objects.for_tenant(tenant).filter(kind="api_key.revoked").exists()


def test_create_reviewer_generates_a_password_without_a_terminal():
    run("create_tenant", "acme")
    output = run(
        "create_reviewer",
        "--tenant",
        "acme",
        "--username",
        "rita",
        "--generate-password",
    )
    password = output.strip().splitlines()[-1].removeprefix("password: ")
    user = authenticate(
        RequestFactory().post("/admin/login/"), username="rita", password=password
    )
    assert user is not None and user.is_staff
    assert Membership.objects.get(user=user).role == "reviewer"


def test_create_api_key_names_are_unique_and_not_empty():
    run("create_tenant", "acme")
    run("create_api_key", "--tenant", "acme", "--scopes", "runs", "--name", "billing")
    with pytest.raises(CommandError, match="already has a key named 'billing'"):
        run(
            "create_api_key",
            "--tenant",
            "acme",
            "--scopes",
            "runs",
            "--name",
            "billing",
        )
    with pytest.raises(CommandError, match="needs a name"):
        run("create_api_key", "--tenant", "acme", "--scopes", "runs", "--name", " ")
    # Without --name, each key gets a free default name.
    run("create_api_key", "--tenant", "acme", "--scopes", "runs")
    run("create_api_key", "--tenant", "acme", "--scopes", "runs")
    assert sorted(ApiKey.objects.values_list("name", flat=True)) == [
        "billing",
        "cli key",
        "cli key 2",
    ]


def sessions_waiting_on_a_lock() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return cursor.fetchone()[0]


@pytest.mark.django_db(transaction=True)
def test_two_keys_made_at_once_with_one_name_one_is_refused_clearly():
    """The name check passes in both (neither sees the other's row yet); the
    unique constraint stops the second, which says why, not IntegrityError."""
    tenant = Tenant.objects.create(slug="race", name="race")
    first_inserted, release = threading.Event(), threading.Event()
    outcome: dict[str, object] = {}

    def first():
        try:
            with transaction.atomic():
                make_api_key(tenant, name="billing")
                first_inserted.set()
                release.wait(60)
        finally:
            connection.close()

    def second():
        first_inserted.wait(60)
        try:
            make_api_key(tenant, name="billing")
        except Exception as exc:  # noqa: BLE001  what it raised is the point
            outcome["error"] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    # The second insert waits on the first's uncommitted row in the index.
    wait_for(
        lambda: sessions_waiting_on_a_lock() == 1,
        timeout=30,
        what="the second insert to wait on the first",
    )
    release.set()
    for thread in threads:
        thread.join(60)
    assert isinstance(outcome["error"], services.ApiKeyNameTaken)
    assert "already has a key named 'billing'" in str(outcome["error"])
    assert ApiKey.objects.filter(tenant=tenant).count() == 1
