"""Operators' commands for tenants, keys and reviewers."""

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth import authenticate
from django.core.management import CommandError, call_command

from audit.models import AuditEvent
from runs.models import ApiKey, Membership, Tenant
from tests.factories import api_client

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parents[2]


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
    user = authenticate(username="rita", password=password)
    assert user is not None and user.is_staff
    assert Membership.objects.get(user=user).role == "reviewer"


def manage_check(**env: str) -> subprocess.CompletedProcess:
    """`manage.py check` in a fresh process with production-like settings."""
    env = {
        **os.environ,
        "DEBUG": "false",
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "SECRET_KEY": "x",
        **env,
    }
    return subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_process_refuses_to_start_without_master_keys_when_debug_is_off():
    result = manage_check(GATEHOUSE_MASTER_KEYS="")
    assert result.returncode != 0
    assert "GATEHOUSE_MASTER_KEYS is not set and DEBUG is off" in result.stderr


def test_malformed_master_key_ring_is_refused():
    result = manage_check(GATEHOUSE_MASTER_KEYS="k1:c2hvcnQ=")
    assert result.returncode != 0
    assert "must be 32 bytes" in result.stderr


def test_embedded_mode_generates_a_key_once(tmp_path):
    key_file = tmp_path / "master.key"
    keys = []
    for _ in range(2):
        result = manage_check(
            DEBUG="true", GATEHOUSE_MASTER_KEYS="", GATEHOUSE_VAR_DIR=str(tmp_path)
        )
        assert result.returncode == 0, result.stderr
        assert "GATEHOUSE_MASTER_KEYS is not set" in result.stderr
        keys.append(key_file.read_text())
    assert keys[0].startswith("embedded-1:")
    assert keys[0] == keys[1]  # the second start reuses the key, never replaces it
    assert oct(key_file.stat().st_mode & 0o777) == "0o600"
