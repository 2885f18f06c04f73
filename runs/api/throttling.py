import time
import uuid

from django.core.cache import caches
from django.core.cache.backends.redis import RedisCache
from rest_framework.settings import api_settings
from rest_framework.throttling import SimpleRateThrottle

# DRF's sliding window (the times of the requests still inside it) as a Redis
# sorted set, read and updated in one round trip where DRF takes two (a GET of
# the list, a SET of it back) and can lose a concurrent request's count. A
# refused request is not counted, as in DRF. Answers {allowed, wait in ms}.
_SLIDING_WINDOW = """
local key, now, window, limit = KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]),
    tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
if redis.call('ZCARD', key) >= limit then
    local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
    return {0, math.max(0, math.ceil(tonumber(oldest[2]) + window - now))}
end
redis.call('ZADD', key, now, ARGV[4])
redis.call('PEXPIRE', key, window)
return {1, 0}
"""


class PrincipalRateThrottle(SimpleRateThrottle):
    """A request budget per API key (or per logged-in user, or per address)."""

    scope = "principal"
    # redis-py's Script: sent by its SHA1 (EVALSHA), loaded on a NOSCRIPT.
    _script = None

    def get_rate(self) -> str | None:
        # Read per request rather than once at import: the rate is a setting.
        return api_settings.DEFAULT_THROTTLE_RATES.get(self.scope)

    def get_cache_key(self, request, view) -> str:
        if request.auth is not None and hasattr(request.auth, "prefix"):
            ident = f"key:{request.auth.prefix}"
        elif request.user and request.user.is_authenticated:
            ident = f"user:{request.user.pk}"
        else:
            ident = f"addr:{self.get_ident(request)}"
        return self.cache_format % {"scope": self.scope, "ident": ident}

    def allow_request(self, request, view) -> bool:
        backend = caches["default"]  # DRF's `self.cache` is a proxy of it
        if self.rate is None or not isinstance(backend, RedisCache):
            # Another cache (the embedded mode's, the tests'): DRF's own way.
            return super().allow_request(request, view)
        key = self.get_cache_key(request, view)
        if key is None:
            return True
        key = backend.make_and_validate_key(key)
        client = backend._cache.get_client(key, write=True)
        if PrincipalRateThrottle._script is None:
            PrincipalRateThrottle._script = client.register_script(_SLIDING_WINDOW)
        now_ms = int(time.time() * 1000)
        allowed, wait_ms = PrincipalRateThrottle._script(
            keys=[key],
            args=[
                now_ms,
                int(self.duration * 1000),
                self.num_requests,
                uuid.uuid4().hex,
            ],
            client=client,
        )
        self._wait = int(wait_ms) / 1000
        return bool(allowed)

    def wait(self) -> float | None:
        if hasattr(self, "_wait"):
            return self._wait
        return super().wait()
