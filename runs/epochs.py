"""Epochs in the shared cache: how a process knows that what it keeps from the
database is still what the database holds, whichever process changed it.

An epoch is a random token in the shared cache (Redis) that every change to
some rows replaces (their post_save and post_delete signals, in whichever
process the change happens), before the change commits and again after it,
so that what a process read in between is not kept past the commit. A process
keeps what it read from the database under the epoch it read *before* it, and
uses it only while that epoch is still the current one. A write that sends no
signal (a bulk `update()`) replaces nothing: what a process keeps is also read
again after an age of the keeper's choosing.

Only with Redis as the cache: with a per-process cache (the embedded mode's
default, locmem) another process's change could not be seen, so nothing is
kept (`enabled()` is False, `current()` None).

Two epochs: the access epoch (runs.api.key_cache: the API keys a web process
verified, read in the authentication's own script) and the webhook
subscriptions' (webhooks.services: which tenants have none).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Collection

from django.core.cache import cache
from django.db import transaction
from django.db.models.signals import post_delete, post_save

from runs.cache import redis_cache
from runs.outages import BROKER_ERRORS

# An epoch that expires is replaced by a new one: every process reads again.
SECONDS = 24 * 3600


def enabled() -> bool:
    return redis_cache() is not None


def fresh() -> int:
    """A token nobody has kept anything under. An int, which Django's Redis
    cache stores as its digits: a Lua script compares it as it is stored."""
    return secrets.randbits(63)


class SharedEpoch:
    """One epoch: its key in the shared cache, what this process forgets when
    it replaces it, and the fields whose change is not a change of what is
    kept (`ignored_fields`: a save of only those replaces nothing)."""

    def __init__(
        self,
        key: str,
        *,
        forget: Callable[[], None],
        ignored_fields: Collection[str] = (),
    ) -> None:
        self.key = key
        self._forget = forget
        self._ignored = frozenset(ignored_fields)

    def current(self) -> int | None:
        """The epoch now, None without Redis; one started if there is none
        (expired, or a flushed Redis), under which nobody has kept anything.

        None too while Redis is unreachable: its user then keeps nothing and
        reads the database, as without Redis. Raising would make what only
        saves a read depend on Redis (a commit's webhook deliveries, written
        by receivers whose error is only logged, would be lost)."""
        if not enabled():
            return None
        try:
            epoch = cache.get(self.key)
            if epoch is None:
                cache.add(self.key, fresh(), timeout=SECONDS)
                epoch = cache.get(self.key)
        except BROKER_ERRORS:
            return None
        return epoch

    def renew(self) -> None:
        """Every process reads from the database again."""
        self._forget()
        if enabled():
            cache.set(self.key, fresh(), timeout=SECONDS)

    def ignores(self, update_fields) -> bool:
        """Whether a save of `update_fields` changes nothing kept."""
        return update_fields is not None and set(update_fields) <= self._ignored

    def _changed(self, sender, instance=None, update_fields=None, **kwargs) -> None:
        if self.ignores(update_fields):
            return
        self.renew()
        transaction.on_commit(self.renew)

    def watch(self, *models) -> None:
        """Replace the epoch on every save and delete of these models."""
        for model in models:
            uid = f"{self.key}-{model._meta.label}"
            post_save.connect(self._changed, sender=model, dispatch_uid=f"{uid}-save")
            post_delete.connect(
                self._changed, sender=model, dispatch_uid=f"{uid}-delete"
            )
