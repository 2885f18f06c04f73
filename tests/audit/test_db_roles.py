"""The application connected as a non-owner Postgres role, as docs/security.md
tells operators to run it: it records, seals, verifies and purges the audit
trail, and can change or remove audit rows in no other way."""

import datetime
import io
from contextlib import contextmanager

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, transaction

from audit import sealing
from audit.models import AuditBlock, AuditEvent, AuditVerification
from audit.services import audit_verify, purge_before
from tests.audit.helpers import BASE_TIME, add_events, reseal
from tests.factories import make_tenant, tenant_with_client

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="session")
def app_role(django_db_setup, django_db_blocker):
    """A login role that owns nothing, granted by `grant_app_role`.

    Roles are shared by every database of the cluster: the name follows the
    test database's, so parallel suites do not share one.
    """
    role = f"{connection.settings_dict['NAME']}_app"
    with django_db_blocker.unblock():
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role])
            if cursor.fetchone() is None:
                cursor.execute(f"CREATE ROLE {connection.ops.quote_name(role)} LOGIN")
        call_command("grant_app_role", role, stdout=io.StringIO())
    yield role
    with django_db_blocker.unblock():
        with connection.cursor() as cursor:
            cursor.execute(f"DROP OWNED BY {connection.ops.quote_name(role)}")
            cursor.execute(f"DROP ROLE {connection.ops.quote_name(role)}")


@contextmanager
def connected_as(user: str):
    """The default connection, reconnected as `user` for the block."""
    settings_dict = connection.settings_dict
    previous = settings_dict["USER"]
    connection.close()
    settings_dict["USER"] = user
    try:
        yield
    finally:
        connection.close()
        settings_dict["USER"] = previous


@pytest.fixture
def as_app_role(app_role):
    """The test runs as the application role; the suite's flush as the owner."""
    with connected_as(app_role):
        yield app_role


def current_user() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_user")
        return cursor.fetchone()[0]


def sealed_tenant(events: int = 20):
    tenant = make_tenant()
    add_events(tenant, events)
    sealing.seal_all()
    audit_verify(tenant=tenant)
    return tenant


def refused(sql: str, params: list, *, match: str) -> None:
    with pytest.raises(DatabaseError, match=match), transaction.atomic():
        with connection.cursor() as cursor:
            # What the finding used: any role may set a custom setting.
            cursor.execute("SET LOCAL gatehouse.audit_purge = 'on'")
            cursor.execute(sql, params)


def test_the_purge_setting_no_longer_opens_the_audit_tables(as_app_role):
    tenant = sealed_tenant()
    assert current_user() == as_app_role
    for sql in (
        "UPDATE audit_auditevent SET actor_label = 'rita' WHERE tenant_id = %s",
        "DELETE FROM audit_auditevent WHERE tenant_id = %s",
        "UPDATE audit_auditblock SET block_hash = 'x' WHERE tenant_id = %s",
        "DELETE FROM audit_auditblock WHERE tenant_id = %s",
        "UPDATE audit_auditverification SET ok = true WHERE tenant_id = %s",
        "DELETE FROM audit_auditverification WHERE tenant_id = %s",
    ):
        refused(sql, [tenant.pk], match="permission denied")
    assert AuditEvent.objects.for_tenant(tenant).count() == 21
    assert AuditVerification.objects.for_tenant(tenant).get().ok


def test_the_triggers_refuse_even_where_a_grant_is_too_wide(app_role):
    """Grants can be widened by mistake; the triggers still check who asks."""
    tenant = sealed_tenant()
    tables = "audit_auditevent, audit_auditverification"
    with connection.cursor() as cursor:
        cursor.execute(f"GRANT UPDATE, DELETE ON {tables} TO {app_role}")
    try:
        with connected_as(app_role):
            refused(
                "DELETE FROM audit_auditevent WHERE tenant_id = %s",
                [tenant.pk],
                match="append-only",
            )
            refused(
                "UPDATE audit_auditverification SET ok = false WHERE tenant_id = %s",
                [tenant.pk],
                match="append-only",
            )
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"REVOKE UPDATE, DELETE ON {tables} FROM {app_role}")
    assert AuditEvent.objects.for_tenant(tenant).count() == 21


@pytest.mark.parametrize(
    "sql",
    [
        "TRUNCATE audit_auditevent CASCADE",
        "TRUNCATE audit_auditverification",
        "ALTER TABLE audit_auditevent DISABLE TRIGGER audit_auditevent_append_only",
        "DROP TRIGGER audit_auditblock_append_only ON audit_auditblock",
        "ALTER FUNCTION audit_purge_through(bigint, bigint) OWNER TO CURRENT_USER",
    ],
)
def test_the_app_role_cannot_take_the_protection_away(as_app_role, sql):
    sealed_tenant()
    with pytest.raises(DatabaseError), transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(sql)
    assert AuditEvent.objects.exists()


def test_the_app_role_records_seals_verifies_and_purges(as_app_role):
    tenant = make_tenant()
    add_events(tenant, 30, at=lambda seq: BASE_TIME + datetime.timedelta(days=seq))
    sealing.seal_all()
    result = purge_before(tenant=tenant, before=BASE_TIME + datetime.timedelta(days=40))
    assert (result.through_seq, result.events, result.blocks) == (31, 31, 1)
    verification = audit_verify(tenant=tenant, checked_by="app role")
    assert verification.ok, verification.problem
    assert not AuditBlock.objects.for_tenant(tenant).exists()


def test_the_purge_function_removes_whole_sealed_blocks_only(as_app_role):
    tenant = sealed_tenant()
    add_events(tenant, 5)  # unsealed
    for through in (10, 26):
        with pytest.raises(DatabaseError, match="no sealed block"):
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(
                    "SELECT * FROM audit_purge_through(%s, %s)", [tenant.pk, through]
                )
    assert AuditEvent.objects.for_tenant(tenant).count() == 26


def test_the_api_works_as_the_app_role(as_app_role):
    tenant, client = tenant_with_client(scopes=["runs", "audit"])
    response = client.post(
        "/api/v1/threads", {"thread_id": "t-1", "agent": "echo"}, format="json"
    )
    assert response.status_code == 201, response.content
    sealing.seal_all()
    assert client.get("/api/v1/audit/verify").json()["ok"] is True
    assert client.get("/api/v1/audit/head").json()["head_seq"] >= 2


def test_grant_app_role_refuses_an_unknown_role_and_the_owner():
    with pytest.raises(CommandError, match="no role"):
        call_command("grant_app_role", "no_such_role_here", stdout=io.StringIO())
    with pytest.raises(CommandError, match="owner"):
        call_command(
            "grant_app_role", connection.settings_dict["USER"], stdout=io.StringIO()
        )


def test_only_the_owner_can_seal_legacy_blocks_again(app_role):
    tenant = sealed_tenant()
    reseal(tenant)  # as blocks sealed before seals were keyed
    with connected_as(app_role):
        with pytest.raises(CommandError, match="must be owner of table"):
            call_command("audit_reseal_legacy", stdout=io.StringIO())
    call_command("audit_reseal_legacy", stdout=io.StringIO())
    assert sealing.verify_tenant(tenant_id=tenant.pk).ok
