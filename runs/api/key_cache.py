"""API keys this process has verified, so that a request costs no key query.

A key found in the database is kept here (its tenant and, for a personal key,
its owner's membership with it) under the *access epoch* it was read in: a
random token in the shared cache (Redis) that every change to what
authenticates a request replaces, in whichever process it happens (a key
saved or deleted, so revoked; a membership, a user or a tenant saved or
deleted). A request reads the epoch in the round trip that also checks its
address's failed authentications (`runs.api.authentication`), and uses a kept
key only if the epoch it was read in is still the current one: a revocation
is seen by every process at its next request. The epoch is replaced before
the change commits and again after it, so a key read in between is not kept
past the commit.

Only with Redis as the cache: with a per-process cache (the embedded mode's
default, locmem) another process's revocation could not be seen, so every
request reads its key from the database, as before.
"""

from __future__ import annotations

import copy
import hmac
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.db import transaction
from django.db.models.signals import post_delete, post_save

from runs.api.throttling import redis_cache
from runs.models import ApiKey, Membership, Tenant

EPOCH_KEY = "gatehouse:access-epoch"
# An epoch that expires is replaced by a new one: every process reads again.
EPOCH_SECONDS = 24 * 3600
# A kept key is read again at least this often, whatever the epoch says: a
# bound on what a write that sends no signal (a bulk `update()`) can leave stale.
MAX_AGE_SECONDS = 300
MAX_KEYS = 10_000


@dataclass
class _Kept:
    api_key: ApiKey
    epoch: bytes  # as stored: compared by the Lua script, never parsed
    read_at: float


_kept: OrderedDict[str, _Kept] = OrderedDict()
_lock = threading.Lock()


def enabled() -> bool:
    return redis_cache() is not None


def fresh_epoch() -> int:
    """A token nobody has kept keys under. An int, which Django's Redis cache
    stores as its digits: a Lua script compares it as it is stored."""
    return secrets.randbits(63)


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


def keep(api_key: ApiKey, epoch: bytes | None) -> None:
    """Keep a key just read from the database (the epoch read before it)."""
    if epoch is None:
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


def new_epoch() -> None:
    """Every process reads its keys from the database again."""
    with _lock:
        _kept.clear()
    if enabled():
        cache.set(EPOCH_KEY, fresh_epoch(), timeout=EPOCH_SECONDS)


def _access_changed(sender, instance=None, update_fields=None, **kwargs) -> None:
    if update_fields is not None and set(update_fields) <= {
        "last_login",
        "last_used_at",
    }:
        return  # a sign-in or a use, not a change of access
    new_epoch()
    transaction.on_commit(new_epoch)


def connect() -> None:
    """Replace the epoch on every change to keys, memberships, users, tenants."""
    for model in (ApiKey, Membership, Tenant, get_user_model()):
        post_save.connect(_access_changed, sender=model, dispatch_uid=f"epoch-{model}")
        post_delete.connect(
            _access_changed, sender=model, dispatch_uid=f"epoch-del-{model}"
        )
