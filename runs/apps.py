import sqlite3

from django.apps import AppConfig
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed

from runs import crypto, registry


def _forget_cached_settings(*, setting: str, **kwargs) -> None:
    """Tests override settings; the caches built from them must follow."""
    if setting == "GATEHOUSE_MASTER_KEYS":
        crypto.keyring.cache_clear()
    if setting == "GATEHOUSE_AUDIT_KEYS":
        crypto.audit_keyring.cache_clear()
    if setting in {
        "GATEHOUSE_AGENTS",
        "GATEHOUSE_BUILTIN_AGENTS",
        "GATEHOUSE_DRAINING_AGENTS",
    }:
        registry.agents.cache_clear()


# The embedded mode writes a row and its audit event with RETURNING
# (audit.services.record_with_write), which SQLite has since 3.35; Django 5.2
# accepts 3.31 and silently drops RETURNING from inserts before 3.35.
SQLITE_FLOOR = (3, 35)


def require_sqlite_returning(version: tuple[int, ...] = sqlite3.sqlite_version_info):
    engines = {db["ENGINE"] for db in settings.DATABASES.values()}
    if "django.db.backends.sqlite3" in engines and version < SQLITE_FLOOR:
        raise ImproperlyConfigured(
            f"SQLite {'.'.join(map(str, version))} is too old: Gatehouse "
            f"needs {'.'.join(map(str, SQLITE_FLOOR))} or later (RETURNING)"
        )


class RunsConfig(AppConfig):
    name = "runs"
    verbose_name = "Tenants, threads and runs"

    def ready(self) -> None:
        from runs import (
            admin_logins,
            tasks,  # noqa: F401  registers the tasks runs.dispatch sends
        )
        from runs.api import (
            key_cache,
            schema,  # noqa: F401  registers the auth scheme
        )

        setting_changed.connect(_forget_cached_settings)
        admin_logins.connect_lockout_audit()
        key_cache.connect()
        # Fail at start-up, not at the first use, when a key ring or the agent
        # registry is misconfigured.
        crypto.keyring()
        crypto.audit_keyring()
        require_sqlite_returning()
        registry.agents()
