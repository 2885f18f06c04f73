"""API keys this process has verified, so that a request costs no key query.

A key found in the database is kept here (its tenant and, for a personal key,
its owner's membership with it) under the *access epoch* it was read in: a
random token in the shared cache (Redis) that every change to what
authenticates a request replaces, in whichever process it happens (a key
saved or deleted, so revoked; a membership, a user or a tenant saved or
deleted). A request reads the epoch in the same round trip as the failed
authentications of its address (`get_many`), and uses a kept key only if the
epoch it was read in is still the current one: a revocation is seen by every
process at its next request. The epoch is replaced before the change commits
and again after it, so a key read in between is not kept past the commit.

Only with a cache that processes share: with a per-process cache (the
embedded mode's default, locmem) another process's revocation could not be
seen, so every request reads its key from the database, as before.
"""

from __future__ import annotations

import copy
import hmac
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass

from django.contrib.auth import get_user_model
from django.core.cache import cache, caches
from django.core.cache.backends.dummy import DummyCache
from django.core.cache.backends.locmem import LocMemCache
from django.db import transaction
from django.db.models.signals import post_delete, post_save

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
    epoch: str
    read_at: float


_kept: OrderedDict[str, _Kept] = OrderedDict()
_lock = threading.Lock()


def enabled() -> bool:
    # `cache` is a proxy: ask the backend itself.
    return not isinstance(caches["default"], (LocMemCache, DummyCache))


def read(keys: list[str]) -> tuple[dict, str | None]:
    """The cache values of `keys` and the current epoch, in one round trip."""
    if not enabled():
        return cache.get_many(keys), None
    values = cache.get_many([*keys, EPOCH_KEY])
    epoch = values.pop(EPOCH_KEY, None)
    if epoch is None:
        # First use, or the cache lost it: start an epoch nobody has kept keys
        # under (add: the first of racing processes wins, all use its token).
        cache.add(EPOCH_KEY, uuid.uuid4().hex, timeout=EPOCH_SECONDS)
        epoch = cache.get(EPOCH_KEY)
    return values, epoch


def find(prefix: str, secret_hash: str, epoch: str | None) -> ApiKey | None:
    """A key kept under the current epoch whose digest is this secret's."""
    if epoch is None:
        return None
    with _lock:
        kept = _kept.get(prefix)
    if (
        kept is None
        or kept.epoch != epoch
        or time.monotonic() - kept.read_at > MAX_AGE_SECONDS
        or not hmac.compare_digest(kept.api_key.secret_hash, secret_hash)
    ):
        return None
    # A copy per request: the kept instance is shared by concurrent requests.
    return copy.copy(kept.api_key)


def keep(api_key: ApiKey, epoch: str | None) -> None:
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
        cache.set(EPOCH_KEY, uuid.uuid4().hex, timeout=EPOCH_SECONDS)


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
