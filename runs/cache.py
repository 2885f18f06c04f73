"""Django's Redis cache backend, with one connection pool and one redis-py
client per server for the whole process.

Django's backend builds a new `redis.Redis` for every cache call, and redis-py's
constructor fills its table of some 170 response callbacks each time: about a
millisecond of CPU per call, and every API request makes one or two (its key's access
epoch with its address's failed authentications; its request budget).

Its connection pools are per backend *instance*, and Django's `caches` keeps
an instance per thread and per asyncio context: under ASGI every request is a
context of its own, so every request built a new pool and opened a new TCP
connection to Redis (with redis-py's handshake: HELLO, CLIENT SETINFO, whose
library version comes from `importlib.metadata`, some 6% of the web process's
CPU). Here the pools (and their clients) are the process's, shared by every
instance of the backend with the same server and options. A redis-py client
and its pool are safe to share between threads: a command takes a connection
from the pool and gives it back; a forked child's pool opens its own.
`config/settings.py` puts this backend in place of Django's when `CACHE_URL`
names Redis.
"""

from __future__ import annotations

import threading

from django.core.cache import caches
from django.core.cache.backends.redis import RedisCache as DjangoRedisCache
from django.core.cache.backends.redis import RedisCacheClient

# (server URL, pool options) -> (pool, client), for the whole process.
_shared: dict[tuple[str, str], tuple[object, object]] = {}
_lock = threading.Lock()


class _PooledClients(RedisCacheClient):
    def _shared(self, write: bool) -> tuple[object, object]:
        server = self._servers[self._get_connection_pool_index(write)]
        key = (server, repr(sorted(self._pool_options.items())))
        shared = _shared.get(key)
        if shared is None:
            with _lock:
                shared = _shared.get(key)
                if shared is None:
                    pool = self._pool_class.from_url(server, **self._pool_options)
                    shared = _shared[key] = (pool, self._client(connection_pool=pool))
        return shared

    def _get_connection_pool(self, write):
        return self._shared(write)[0]

    def get_client(self, key=None, *, write=False):
        return self._shared(write)[1]


class RedisCache(DjangoRedisCache):
    def __init__(self, server, params) -> None:
        super().__init__(server, params)
        self._class = _PooledClients


def redis_cache() -> DjangoRedisCache | None:
    """The default cache when it is Redis (`cache` is a proxy: ask the backend)."""
    backend = caches["default"]
    return backend if isinstance(backend, DjangoRedisCache) else None
