"""The embedded mode (SQLite, no triggers, no roles): the keyed chain alone
still detects a rewrite, re-sealed or not (issue 16, finding 1)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SETUP = """
import django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
call_command("create_tenant", "acme")
call_command("create_api_key", "--tenant", "acme", "--scopes", "audit")
call_command("verify_audit", "--seal")
"""

# The finding's forgery (a decision handed to another reviewer), then every
# block sealed again with the published formulas, without the key or under a
# guessed one; then verify_audit as an operator runs it.
FORGE = """
import sys
import django
django.setup()
from django.core.management import execute_from_command_line
from runs.models import Tenant
from tests.audit.helpers import reseal, tamper
tenant = Tenant.objects.get(slug="acme")
tamper(
    "UPDATE audit_auditevent SET actor_label = 'someone-else' "
    "WHERE tenant_id = %s AND seq = 2",
    [tenant.pk],
)
if sys.argv[1] == "unkeyed":
    reseal(tenant)
elif sys.argv[1] == "guessed":
    reseal(tenant, key=bytes(32), key_id="embedded-audit-1")
execute_from_command_line(["manage.py", "verify_audit"])
"""


def embedded(var_dir: Path, *args: str) -> subprocess.CompletedProcess:
    """Python in the embedded mode (no DATABASE_URL) on its own var dir."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"DATABASE_URL", "CELERY_BROKER_URL"}
    }
    env.update(
        DJANGO_SETTINGS_MODULE="config.settings",
        GATEHOUSE_VAR_DIR=str(var_dir),
        GATEHOUSE_MASTER_KEYS="",
        GATEHOUSE_AUDIT_KEYS="",
    )
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def sealed_var_dir(tmp_path_factory):
    """A tenant with three events, sealed with the generated audit key."""
    var_dir = tmp_path_factory.mktemp("embedded")
    result = embedded(var_dir, "-c", SETUP)
    assert "acme: intact: 1 block(s), 2 event(s)" in result.stdout, result.stderr
    return var_dir


@pytest.mark.parametrize(
    ("forgery", "problem"),
    [
        ("edit", "BROKEN at seq 2: event #2 does not match its sealed digest"),
        ("unkeyed", "BROKEN at seq 1: block #1-2 was sealed without an audit key"),
        ("guessed", "BROKEN at seq 1: block #1-2 was altered after sealing"),
    ],
)
def test_a_reattributed_event_is_detected_on_sqlite(
    sealed_var_dir, tmp_path, forgery, problem
):
    var_dir = shutil.copytree(sealed_var_dir, tmp_path / "var")
    result = embedded(var_dir, "-c", FORGE, forgery)
    assert result.returncode == 1, result.stderr
    assert problem in result.stdout
