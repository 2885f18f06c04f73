"""Bearer API keys: `Authorization: Bearer gh_xxxxxxxxx.<secret>`."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.utils import timezone
from rest_framework import authentication, exceptions
from rest_framework.throttling import SimpleRateThrottle

from runs import epochs
from runs.api import key_cache
from runs.api.throttling import (
    WINDOW_FUNCTIONS,
    PrincipalRateThrottle,
    add_to_window,
    now_ms,
    run_script,
)
from runs.models import ApiKey

# last_used_at is a hint for operators, not an access log; writing it on every
# request would make every read a write.
LAST_USED_RESOLUTION = timedelta(minutes=1)


class ApiKeyUser:
    """The request.user of a key-authenticated request: a program, not a person."""

    is_authenticated = True
    is_anonymous = False
    is_active = True
    is_staff = False
    is_superuser = False

    def __init__(self, api_key: ApiKey) -> None:
        self.api_key = api_key
        self.pk = None

    def __str__(self) -> str:
        return f"API key {self.api_key.prefix}"

    def get_username(self) -> str:
        return str(self)


# One round trip before a key is used (Redis): the address's failed
# authentications, then the access epoch (`runs.api.key_cache`, started here
# if the cache lost it), then, only when the key this process keeps for the
# secret was read under that same epoch, so is still valid, the key's request
# budget (`runs.api.throttling`). A secret that turns out wrong, revoked or
# unknown never counts against the budget of the key it names.
# KEYS: failures, epoch[, budget]; ARGV: now (ms), failure window (ms),
# failure limit, a fresh epoch, its lifetime (s)[, the kept key's epoch,
# budget window (ms), budget limit, member]. Answers {ms the address must wait
# (-1: it may try), epoch, the budget's verdict (-1: not counted, 0: refused,
# 1: allowed), ms to wait for the budget}.
_ADMIT = (
    WINDOW_FUNCTIONS
    + """
local now = tonumber(ARGV[1])
local wait = full(KEYS[1], now, tonumber(ARGV[2]), tonumber(ARGV[3]))
if wait then
    return {wait, '', -1, 0}
end
local epoch = redis.call('GET', KEYS[2])
if not epoch then
    epoch = ARGV[4]
    redis.call('SET', KEYS[2], epoch, 'EX', ARGV[5])
end
if KEYS[3] and epoch == ARGV[6] then
    local verdict = charge(KEYS[3], now, tonumber(ARGV[7]), tonumber(ARGV[8]),
        ARGV[9])
    return {-1, epoch, verdict[1], verdict[2]}
end
return {-1, epoch, -1, 0}
"""
)


class AuthenticationFailures(SimpleRateThrottle):
    """Failed API authentications per client address.

    Past GATEHOUSE_AUTH_FAILURE_RATE, the address is answered 429 (with
    Retry-After) before any key it sends is even looked up, so that guessing
    secrets costs a window per few tries. Counted in the cache: with several
    web processes, set CACHE_URL to Redis so that they share the count.
    """

    scope = "auth_failures"

    def get_rate(self) -> str:
        return settings.GATEHOUSE_AUTH_FAILURE_RATE

    def get_cache_key(self, request, view=None) -> str:
        ident = self.cache_format % {
            "scope": self.scope,
            "ident": self.get_ident(request),
        }
        # In Redis a sorted set, not DRF's pickled list: a name of its own.
        return f"{ident}:window" if key_cache.enabled() else ident

    def admit(self, request, kept=None, budget=None):
        """Seconds the address must wait (None when it may try), the access
        epoch (None without Redis), and the verdict on `budget` (the window
        and arguments of a request counted with this key, counted only if
        `kept` was read under the current epoch; None if not counted)."""
        self.key = self.get_cache_key(request)
        if not key_cache.enabled():
            self.now = self.timer()
            self.history = [
                at
                for at in self.cache.get(self.key, [])
                if at > self.now - self.duration
            ]
            wait = self.wait() if len(self.history) >= self.num_requests else None
            return wait, None, None
        keys = [self.key, key_cache.EPOCH_KEY]
        args = [
            now_ms(),
            self.duration * 1000,
            self.num_requests,
            epochs.fresh(),
            epochs.SECONDS,
        ]
        if kept is not None and budget is not None:
            keys.append(budget[0])
            args += [kept.epoch, *budget[1]]
        wait_ms, epoch, allowed, budget_wait_ms = run_script(_ADMIT, keys, args)
        if wait_ms >= 0:
            return wait_ms / 1000, None, None
        verdict = None if allowed < 0 else (bool(allowed), budget_wait_ms)
        return None, epoch, verdict

    def record_failure(self) -> None:
        if key_cache.enabled():
            add_to_window(self.key, self.duration)
            return
        self.history.insert(0, self.now)
        self.cache.set(self.key, self.history, self.duration)


class ApiKeyAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode(
            "latin-1", errors="replace"
        )
        if not header:
            return None
        keyword, _, secret = header.partition(" ")
        if keyword.lower() != self.keyword.lower():
            return None
        return self.authenticate_secret(request, secret.strip())

    def authenticate_secret(self, request, secret: str):
        """The key whose secret this is; the same 401 for any bad one, and a
        429 for an address that failed too often."""
        prefix, dot, _ = secret.partition(".")
        well_formed = bool(dot and prefix)
        kept = (
            key_cache.find(prefix, ApiKey.hash_secret(secret)) if well_formed else None
        )
        budget = PrincipalRateThrottle.to_count(request, prefix) if kept else None
        failures = AuthenticationFailures()
        wait, epoch, verdict = failures.admit(request, kept, budget)
        if wait is not None:
            raise exceptions.Throttled(
                wait, detail="Too many failed authentications from this address."
            )
        if not well_formed:
            failures.record_failure()
            raise exceptions.AuthenticationFailed("Malformed API key.")
        if kept is not None and kept.epoch == epoch:
            api_key = key_cache.use(kept)
            if verdict is not None:
                PrincipalRateThrottle.counted(request, budget[0], *verdict)
        else:
            # Before the read (key_cache.register): a key read while a change
            # of access holds the registrations is not kept.
            if epoch is not None and not key_cache.register():
                epoch = None  # not kept: read again next time
            api_key = self._verified(prefix, secret)
            if api_key is None:
                failures.record_failure()
                raise exceptions.AuthenticationFailed("Invalid or revoked API key.")
            key_cache.keep(api_key, epoch)
        now = timezone.now()
        if (
            api_key.last_used_at is None
            or now - api_key.last_used_at > LAST_USED_RESOLUTION
        ):
            ApiKey.objects.filter(pk=api_key.pk).update(last_used_at=now)
            key_cache.touched(api_key.prefix, now)
        return ApiKeyUser(api_key), api_key

    @staticmethod
    def _verified(prefix: str, secret: str) -> ApiKey | None:
        """The key from the database, if this is its secret and it may act.

        None alike for unknown, wrong and revoked keys: a caller learns nothing
        about which prefixes exist.
        """
        api_key = ApiKey.objects.select_related("tenant").filter(prefix=prefix).first()
        if (
            api_key is None
            or not api_key.matches(secret)
            or not api_key.is_active
            # A personal key lives only as long as its owner's membership.
            or (api_key.is_personal and api_key.owner_membership is None)
        ):
            return None
        return api_key

    def authenticate_header(self, request) -> str:
        return self.keyword
