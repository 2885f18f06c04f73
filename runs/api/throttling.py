"""Request budgets, and the sliding windows they and failed authentications
are counted in.

DRF's sliding window (the times of the requests still inside it) is kept, in
Redis, as a sorted set, read and updated by a Lua script in one round trip
where DRF takes two (a GET of the list, a SET of it back) and can lose a
concurrent request's count. A refused request is not counted, as in DRF.
With another cache (the embedded mode's, the tests'), DRF's own way.

A request with a key its process has kept has its budget counted in the
round trip of its authentication (`runs.api.authentication`), only once that
round trip has found the key still valid: the throttle then reads the verdict
from the request (`count_with_authentication`).
"""

from __future__ import annotations

import time
import uuid

from rest_framework.settings import api_settings
from rest_framework.throttling import SimpleRateThrottle

from runs.cache import redis_cache

# Lua functions of a window: `full` drops what fell out of it and answers the
# milliseconds to wait when it holds `limit` already (false otherwise); `add`
# counts one more; `charge` both, answering {allowed, wait in ms}.
WINDOW_FUNCTIONS = """
local function full(key, now, window, limit)
    redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
    if redis.call('ZCARD', key) >= limit then
        local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
        return math.max(0, math.ceil(tonumber(oldest[2]) + window - now))
    end
    return false
end
local function add(key, now, window, member)
    redis.call('ZADD', key, now, member)
    redis.call('PEXPIRE', key, window)
end
local function charge(key, now, window, limit, member)
    local wait = full(key, now, window, limit)
    if wait then
        return {0, wait}
    end
    add(key, now, window, member)
    return {1, 0}
end
"""
# KEYS: the window; ARGV: now (ms), window (ms), limit, a member of its own.
_CHARGE = (
    WINDOW_FUNCTIONS
    + """
return charge(KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]),
    ARGV[4])
"""
)
# KEYS: the window; ARGV: now (ms), window (ms), a member of its own.
_ADD = (
    WINDOW_FUNCTIONS
    + """
add(KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3])
return 1
"""
)

# Lua source -> redis-py's Script (sent by its SHA1, EVALSHA; loaded on a NOSCRIPT).
_scripts: dict[str, object] = {}


def run_script(source: str, keys: list[str], args: list) -> list:
    """A Lua script in the cache's Redis, on its keys (as `cache` names them),
    in one round trip."""
    backend = redis_cache()
    # make_key, not make_and_validate_key: the validation only warns about
    # keys memcached could not store (Redis stores any), character by
    # character, three keys a request.
    keys = [backend.make_key(key) for key in keys]
    client = backend._cache.get_client(keys[0], write=True)
    script = _scripts.get(source)
    if script is None:
        script = _scripts[source] = client.register_script(source)
    return script(keys=keys, args=args, client=client)


def now_ms() -> int:
    return int(time.time() * 1000)


def member() -> str:
    """A request's entry in a window: its own, so that two in the same
    millisecond count twice."""
    return uuid.uuid4().hex


def add_to_window(key: str, seconds: int) -> None:
    run_script(_ADD, [key], [now_ms(), seconds * 1000, member()])


class PrincipalRateThrottle(SimpleRateThrottle):
    """A request budget per API key (or per logged-in user, or per address)."""

    scope = "principal"

    def get_rate(self) -> str | None:
        # Read per request rather than once at import: the rate is a setting.
        return api_settings.DEFAULT_THROTTLE_RATES.get(self.scope)

    def key_for(self, ident: str) -> str:
        return self.cache_format % {"scope": self.scope, "ident": ident}

    def get_cache_key(self, request, view) -> str:
        if request.auth is not None and hasattr(request.auth, "prefix"):
            return self.key_for(f"key:{request.auth.prefix}")
        if request.user and request.user.is_authenticated:
            return self.key_for(f"user:{request.user.pk}")
        return self.key_for(f"addr:{self.get_ident(request)}")

    @classmethod
    def to_count(cls, request, prefix: str) -> tuple[str, list] | None:
        """The window and arguments of `WINDOW_FUNCTIONS`' `charge` for a
        request made with this key, to count in the round trip of its
        authentication; None if its view has no such budget."""
        view = (request.parser_context or {}).get("view")
        if cls not in getattr(view, "throttle_classes", ()):
            return None
        throttle = cls()
        if throttle.rate is None:
            return None
        key = throttle.key_for(f"key:{prefix}")
        args = [throttle.duration * 1000, throttle.num_requests, member()]
        return key, args

    @staticmethod
    def counted(request, key: str, allowed: bool, wait_ms: int) -> None:
        """The verdict on a request counted with its authentication."""
        request._counted_budget = (key, allowed, wait_ms / 1000)

    def allow_request(self, request, view) -> bool:
        if self.rate is None or redis_cache() is None:
            return super().allow_request(request, view)
        key = self.get_cache_key(request, view)
        counted = getattr(request, "_counted_budget", None)
        if counted is not None and counted[0] == key:
            _, allowed, self._wait = counted
            return allowed
        allowed, wait_ms = run_script(
            _CHARGE,
            [key],
            [now_ms(), self.duration * 1000, self.num_requests, member()],
        )
        self._wait = int(wait_ms) / 1000
        return bool(allowed)

    def wait(self) -> float | None:
        if hasattr(self, "_wait"):
            return self._wait
        return super().wait()
