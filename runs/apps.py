from django.apps import AppConfig
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
        registry.agents()
