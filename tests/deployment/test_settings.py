"""The two modes as config.settings reads them from the environment: what
production refuses, what it turns on by default, and what the embedded mode
generates and keeps private. Each test starts Gatehouse in a fresh process."""

from __future__ import annotations

import stat

import pytest

from config import embedded
from tests.deployment.processes import (
    PRODUCTION,
    manage,
    production_env,
    settings_in_process,
    shell_env,
    without,
)

FOURTEEN_DAYS = 14 * 24 * 3600
REQUIRED = [
    "SECRET_KEY",
    "GATEHOUSE_MASTER_KEYS",
    "GATEHOUSE_AUDIT_KEYS",
    "ALLOWED_HOSTS",
]
TRANSPORT_SECURITY = [
    "DEBUG",
    "SECURE_SSL_REDIRECT",
    "SECURE_HSTS_SECONDS",
    "SESSION_COOKIE_SECURE",
    "CSRF_COOKIE_SECURE",
    "SESSION_COOKIE_SAMESITE",
    "SESSION_COOKIE_AGE",
]


@pytest.mark.parametrize("missing", REQUIRED)
def test_production_refuses_to_start_without_a_required_variable(missing):
    result = manage("check", env=without(production_env(), missing))
    assert result.returncode != 0
    naming_it = [line for line in result.stderr.splitlines() if missing in line]
    assert len(naming_it) == 1 and naming_it[0].startswith(f"{missing} is not set: ")
    assert "Traceback" not in result.stderr


def test_production_names_every_missing_variable_on_a_line_of_its_own():
    result = manage("check", env=without(production_env(), *REQUIRED))
    assert result.returncode != 0
    named = [
        line.split()[0]
        for line in result.stderr.splitlines()
        if line.endswith(".") and " is not set: " in line
    ]
    assert named == REQUIRED


def test_malformed_master_key_ring_is_refused():
    result = manage("check", env=production_env(GATEHOUSE_MASTER_KEYS="k1:c2hvcnQ="))
    assert result.returncode != 0
    assert "must be 32 bytes" in result.stderr


def test_check_deploy_is_clean_in_production():
    result = manage(
        "check", "--deploy", "--fail-level", "WARNING", env=production_env()
    )
    assert result.returncode == 0, result.stderr
    assert "System check identified no issues" in result.stdout


def test_production_turns_transport_security_on_by_default():
    values = settings_in_process(production_env(), *TRANSPORT_SECURITY)
    assert values["DEBUG"] is False
    assert values["SECURE_SSL_REDIRECT"] is True
    assert values["SECURE_HSTS_SECONDS"] >= 365 * 24 * 3600
    assert values["SESSION_COOKIE_SECURE"] is values["CSRF_COOKIE_SECURE"] is True
    assert values["SESSION_COOKIE_SAMESITE"] == "Lax"
    assert values["SESSION_COOKIE_AGE"] < FOURTEEN_DAYS


def test_deployment_settings_come_from_the_environment():
    values = settings_in_process(
        production_env(
            SECURE_PROXY_SSL_HEADER="HTTP_X_FORWARDED_PROTO,https",
            SECURE_HSTS_SECONDS="600",
            SECURE_HSTS_PRELOAD="true",
            SESSION_COOKIE_SAMESITE="Strict",
            SESSION_COOKIE_AGE="900",
            SECURE_SSL_REDIRECT="false",
        ),
        "SECURE_PROXY_SSL_HEADER",
        "SECURE_HSTS_SECONDS",
        "SECURE_HSTS_PRELOAD",
        "SILENCED_SYSTEM_CHECKS",
        "SESSION_COOKIE_SAMESITE",
        "SESSION_COOKIE_AGE",
        "SECURE_SSL_REDIRECT",
    )
    assert values == {
        "SECURE_PROXY_SSL_HEADER": ["HTTP_X_FORWARDED_PROTO", "https"],
        "SECURE_HSTS_SECONDS": 600,
        "SECURE_HSTS_PRELOAD": True,
        "SILENCED_SYSTEM_CHECKS": [],
        "SESSION_COOKIE_SAMESITE": "Strict",
        "SESSION_COOKIE_AGE": 900,
        "SECURE_SSL_REDIRECT": False,
    }


def test_embedded_mode_keeps_cookies_usable_over_plain_http(tmp_path):
    values = settings_in_process(
        shell_env(GATEHOUSE_VAR_DIR=str(tmp_path)),
        "GATEHOUSE_EMBEDDED",
        *TRANSPORT_SECURITY,
    )
    assert values == {
        "GATEHOUSE_EMBEDDED": True,
        "DEBUG": False,
        "SECURE_SSL_REDIRECT": False,
        "SECURE_HSTS_SECONDS": 0,
        "SESSION_COOKIE_SECURE": False,
        "CSRF_COOKIE_SECURE": False,
        "SESSION_COOKIE_SAMESITE": "Lax",
        "SESSION_COOKIE_AGE": 8 * 3600,
    }


def test_web_process_takes_postgres_connections_from_a_pool():
    values = settings_in_process(production_env(), "DATABASES", entry_point="web")
    database = values["DATABASES"]["default"]
    assert database["CONN_MAX_AGE"] == 0
    assert database["OPTIONS"]["pool"] == {"min_size": 2, "max_size": 10, "timeout": 10}


def test_celery_processes_keep_persistent_connections_without_a_pool():
    values = settings_in_process(production_env(), "DATABASES", entry_point="celery")
    database = values["DATABASES"]["default"]
    assert database["CONN_MAX_AGE"] == 60 and database["CONN_HEALTH_CHECKS"] is True
    assert "pool" not in database.get("OPTIONS", {})


@pytest.mark.parametrize("entry_point", ["web", "celery"])
def test_postgres_parameters_are_bound_by_the_server_and_statements_prepared(
    entry_point,
):
    values = settings_in_process(production_env(), "DATABASES", entry_point=entry_point)
    options = values["DATABASES"]["default"]["OPTIONS"]
    assert options["server_side_binding"] is True
    assert options["prepare_threshold"] == 5


def test_prepared_statements_can_be_turned_off_for_a_transaction_pooler():
    values = settings_in_process(
        production_env(DATABASE_PREPARED_STATEMENTS="false"), "DATABASES"
    )
    options = values["DATABASES"]["default"]["OPTIONS"]
    assert options["server_side_binding"] is True
    assert options["prepare_threshold"] is None


def test_the_embedded_mode_sets_no_postgres_options(tmp_path):
    values = settings_in_process(
        shell_env(GATEHOUSE_VAR_DIR=str(tmp_path)), "DATABASES"
    )
    options = values["DATABASES"]["default"]["OPTIONS"]
    assert "server_side_binding" not in options and "prepare_threshold" not in options


def test_embedded_mode_is_chosen_by_the_absence_of_database_url_not_debug(tmp_path):
    embedded_values = settings_in_process(
        shell_env(GATEHOUSE_VAR_DIR=str(tmp_path), DEBUG="false"),
        "GATEHOUSE_EMBEDDED",
        "DATABASES",
    )
    production_values = settings_in_process(
        production_env(DEBUG="true"), "GATEHOUSE_EMBEDDED", "DATABASES"
    )
    assert embedded_values["GATEHOUSE_EMBEDDED"] is True
    assert embedded_values["DATABASES"]["default"]["NAME"] == str(
        tmp_path / "gatehouse.sqlite3"
    )
    assert production_values["GATEHOUSE_EMBEDDED"] is False
    assert production_values["DATABASES"]["default"]["NAME"] == "gatehouse_unused"


def test_embedded_mode_generates_its_secrets_once_and_reads_them_after(tmp_path):
    env = shell_env(GATEHOUSE_VAR_DIR=str(tmp_path))
    secrets = {
        "SECRET_KEY": "secret.key",
        "GATEHOUSE_MASTER_KEYS": "master.key",
        "GATEHOUSE_AUDIT_KEYS": "audit.key",
    }
    first = settings_in_process(env, *secrets)
    again = settings_in_process(env, *secrets)
    assert first == again
    assert len(first["SECRET_KEY"]) >= 50
    assert first["GATEHOUSE_MASTER_KEYS"].startswith("embedded-1:")
    assert first["GATEHOUSE_AUDIT_KEYS"].startswith("embedded-audit-1:")
    assert len(set(first.values())) == 3
    for setting, file_name in secrets.items():
        path = tmp_path / file_name
        assert path.read_text().strip() == first[setting]
        assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_embedded_mode_uses_a_master_key_ring_from_the_environment(tmp_path):
    ring = PRODUCTION["GATEHOUSE_MASTER_KEYS"]
    values = settings_in_process(
        shell_env(GATEHOUSE_VAR_DIR=str(tmp_path), GATEHOUSE_MASTER_KEYS=ring),
        "GATEHOUSE_MASTER_KEYS",
        "GATEHOUSE_DEVELOPMENT_KEY_FILES",
    )
    assert values == {
        "GATEHOUSE_MASTER_KEYS": ring,
        "GATEHOUSE_DEVELOPMENT_KEY_FILES": {
            "GATEHOUSE_AUDIT_KEYS": str(tmp_path / "audit.key")
        },
    }
    assert not (tmp_path / "master.key").exists()


def test_secure_tree_makes_an_older_var_folder_private(tmp_path):
    (tmp_path / "broker" / "queue").mkdir(parents=True)
    for path in (tmp_path / "gatehouse.sqlite3", tmp_path / "broker/queue/msg"):
        path.write_text("x")
        path.chmod(0o644)
    tmp_path.chmod(0o755)
    embedded.secure_tree(tmp_path)
    assert {
        str(path.relative_to(tmp_path)): oct(stat.S_IMODE(path.stat().st_mode))
        for path in [tmp_path, *tmp_path.rglob("*")]
    } == {
        ".": "0o700",
        "broker": "0o700",
        "broker/queue": "0o700",
        "broker/queue/msg": "0o600",
        "gatehouse.sqlite3": "0o600",
    }
