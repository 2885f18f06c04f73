"""API keys this process has verified, so that a request costs no key query.

A key found in the database is kept here (its tenant and, for a personal key,
its owner's membership with it) under the *access epoch* it was read in
(runs.epochs), which every change to what authenticates a request replaces
(a key saved or deleted, so revoked; a membership, a user or a tenant saved
or deleted). A request reads the epoch in the round trip that also checks its
address's failed authentications (`runs.api.authentication`), and uses a kept
key only if the epoch it was read in is still the current one: a revocation
is seen by every process at its next request.

Only with Redis as the cache: with a per-process cache (the embedded mode's
default, locmem) another process's revocation could not be seen, so every
request reads its key from the database, as before.

A process that changes access must replace the epoch in the Redis the web
processes read, and only its own configuration (`CACHE_URL`) says which Redis
that is: an operator's shell without it would revoke a key the web processes
go on accepting. So a web process first says, in the database that every
process changing access writes to anyway, that it keeps keys in a cache, by a
token that cache holds (`KeyCacheStore`, at most once a minute, before the
read of a key it will keep), and a change that could take access away (a
key, membership, user or tenant changed or deleted; not one created) is
refused, before it is written and in its transaction, while a web process may
still hold keys kept in a cache this process's cache is not: nothing done,
rather than a revocation that is not one. The registrations are read with a
lock that a registration waits for, so a web process that registers during
the change reads the key after it has committed. No request reads the
database for this: a registration is a write per web process per minute.
"""

from __future__ import annotations

import copy
import hmac
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from datetime import timedelta

import psycopg
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.core.management.base import CommandError
from django.db import OperationalError, connection, transaction
from django.db.models.signals import pre_delete, pre_save
from django.utils import timezone
from rest_framework import exceptions

from runs import epochs
from runs.models import ApiKey, KeyCacheStore, Membership, Tenant

# A kept key is read again at least this often, whatever the epoch says: a
# bound on what a write that sends no signal (a bulk `update()`) can leave stale.
MAX_AGE_SECONDS = 300
MAX_KEYS = 10_000
# The token of the cache keys are kept in (`KeyCacheStore`): made by the first
# web process that keeps a key in it.
STORE_KEY = "gatehouse:key-cache-store"
# A web process keeps keys for this long after it last registered...
REGISTER_SECONDS = 60
# ...each for at most MAX_AGE_SECONDS: a registration is live while keys kept
# under it may be, with a minute more for two machines' clocks.
LIVE_SECONDS = REGISTER_SECONDS + MAX_AGE_SECONDS + 60
# Fields whose change takes no access away (a sign-in, a use).
_NOT_ACCESS = frozenset({"last_login", "last_used_at"})


class AccessChangeUnannounced(exceptions.APIException, CommandError):
    """A change of access this process cannot announce to the web processes
    that keep API keys: refused, nothing done. An APIException for the API
    (503), a CommandError for every manage.py command that makes such a
    change (its reason on stderr, exit status 1, not a traceback)."""

    status_code = 503
    default_code = "access_change_unannounced"
    returncode = 1  # CommandError's, which APIException's __init__ leaves unset


@dataclass
class _Kept:
    api_key: ApiKey
    epoch: bytes  # as stored: compared by the Lua script, never parsed
    read_at: float


_kept: OrderedDict[str, _Kept] = OrderedDict()
_lock = threading.Lock()
# When this process last registered its keeping keys (monotonic), if it did.
_registered_at: float | None = None
# The token it registered them under. Put back if the cache lost it (a Redis
# restarted empty, or its keys evicted), so that the registrations already in
# the database still name the cache's token: otherwise every change of access
# would be refused until they aged out (LIVE_SECONDS). This takes a process's
# CACHE_URL to name one logical Redis for the process's life.
_store: str | None = None
# Every token this process has seen its cache hold: `_store` and those before
# it (the cache restarted empty and another process, which had none to put
# back, gave it a new one). By the same assumption each names this process's
# cache, so a change it makes reaches keys kept under any of them.
_held: set[str] = set()
# How long a registration waits for a change of access in progress (its
# lock) before the key is read without being kept: a request is not held for
# a whole change, and a waiting registration does not queue the next change.
REGISTER_LOCK_TIMEOUT = "100ms"


def enabled() -> bool:
    return epochs.enabled()


def find(prefix: str, secret_hash: str) -> _Kept | None:
    """The key this process keeps for this secret, and the epoch it was read
    in (to compare with the current one), if it is not too old to use."""
    with _lock:
        kept = _kept.get(prefix)
    if (
        kept is None
        or time.monotonic() - kept.read_at > MAX_AGE_SECONDS
        or not hmac.compare_digest(kept.api_key.secret_hash, secret_hash)
    ):
        return None
    return kept


def use(kept: _Kept) -> ApiKey:
    # A copy per request: the kept instance is shared by concurrent requests.
    return copy.copy(kept.api_key)


def register() -> bool:
    """Say in the database that this process keeps keys in its cache, before
    it reads a key to keep (at most once every REGISTER_SECONDS). False when
    it cannot say so now: inside a transaction, which could roll back what it
    said. Then the key read is not kept."""
    global _registered_at, _store
    if not enabled():
        return False
    started = time.monotonic()
    if _registered_at is not None and started - _registered_at < REGISTER_SECONDS:
        return True
    store = _cache_token(_store or secrets.token_hex(16))
    if store is None:
        return False
    try:
        # Committed here (durable), and waits, briefly, for a change of access
        # reading the registrations (its lock).
        with transaction.atomic(durable=True):
            if connection.vendor == "postgresql":
                with connection.cursor() as cursor:
                    cursor.execute(
                        f"SET LOCAL lock_timeout = '{REGISTER_LOCK_TIMEOUT}'"
                    )
            if _store is not None and _store != store:
                # The cache lost this process's token and was given another:
                # the old registration names this cache too, and would
                # otherwise refuse every change of access until it aged out.
                KeyCacheStore.objects.filter(store=_store).delete()
            KeyCacheStore.objects.bulk_create(
                [KeyCacheStore(store=store, seen_at=timezone.now())],
                update_conflicts=True,
                unique_fields=["store"],
                update_fields=["seen_at"],
            )
    except RuntimeError:  # "cannot be nested": in a transaction of the caller
        return False
    except OperationalError as error:
        if isinstance(error.__cause__, psycopg.errors.LockNotAvailable):
            return False  # a change of access in progress: not kept this time
        raise
    _registered_at, _store = started, store
    _held.add(store)
    return True


def _cache_token(restore: str | None) -> str | None:
    """The token of this process's cache, `restore` put there if it has none."""
    if restore is not None:
        cache.add(STORE_KEY, restore, timeout=None)
    return cache.get(STORE_KEY)


def keep(api_key: ApiKey, epoch: bytes | None) -> None:
    """Keep a key just read from the database (the epoch read before it,
    after `register()` said so)."""
    if (
        epoch is None
        or _registered_at is None
        or time.monotonic() - _registered_at > REGISTER_SECONDS
    ):
        return
    # Loaded now, under the epoch read before the key: a personal key's
    # membership is part of what the epoch covers.
    _ = api_key.owner_membership
    with _lock:
        _kept[api_key.prefix] = _Kept(api_key, epoch, time.monotonic())
        _kept.move_to_end(api_key.prefix)
        while len(_kept) > MAX_KEYS:
            _kept.popitem(last=False)


def touched(prefix: str, last_used_at) -> None:
    with _lock:
        if (kept := _kept.get(prefix)) is not None:
            kept.api_key.last_used_at = last_used_at


def _forget() -> None:
    global _registered_at
    with _lock:
        _kept.clear()
        # And says again where it keeps them (a test's database rolled back).
        _registered_at = None


ACCESS = epochs.SharedEpoch(
    "gatehouse:access-epoch", forget=_forget, ignored_fields=_NOT_ACCESS
)
EPOCH_KEY = ACCESS.key
# Every process reads its keys from the database again.
new_epoch = ACCESS.renew


def _refuse_unannounced(sender, instance=None, update_fields=None, **kwargs):
    """Before a change that could take access away: refuse it if a web process
    may keep keys in a cache whose epoch this process cannot replace."""
    if kwargs.get("raw") or ACCESS.ignores(update_fields):
        return
    if kwargs.get("signal") is pre_save and instance._state.adding:
        return  # a grant: no kept key is made any less valid by it
    if connection.vendor == "postgresql" and connection.in_atomic_block:
        # Held to the commit: a web process registering now waits, then reads
        # the key as this change leaves it.
        with connection.cursor() as cursor:
            cursor.execute(f"LOCK TABLE {KeyCacheStore._meta.db_table} IN SHARE MODE")
    since = timezone.now() - timedelta(seconds=LIVE_SECONDS)
    live = set(
        KeyCacheStore.objects.filter(seen_at__gte=since).values_list("store", flat=True)
    )
    if not live:
        return
    mine = _cache_token(restore=_store) if enabled() else None
    if live - _held - {mine}:
        raise AccessChangeUnannounced(
            "Web processes keep verified API keys in a cache (Redis) this "
            "process's CACHE_URL does not name, where it cannot tell them of "
            "this change: they would go on accepting what it revokes for up "
            f"to {MAX_AGE_SECONDS} s. Refused, nothing changed: make it with "
            "the web processes' CACHE_URL (docs/configuration.md)."
        )


def connect() -> None:
    """Replace the epoch on every change to keys, memberships, users, tenants,
    and refuse one that could not be announced."""
    models = (ApiKey, Membership, Tenant, get_user_model())
    for model in models:
        pre_save.connect(
            _refuse_unannounced, sender=model, dispatch_uid=f"refuse-{model}"
        )
        pre_delete.connect(
            _refuse_unannounced, sender=model, dispatch_uid=f"refuse-del-{model}"
        )
    ACCESS.watch(*models)
