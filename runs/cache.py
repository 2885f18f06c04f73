"""Django's Redis cache backend, with one redis-py client per connection pool.

Django's backend builds a new `redis.Redis` for every cache call, and redis-py's
constructor fills its table of some 170 response callbacks each time: about a
millisecond of CPU per call, and an API request makes two (its key's access
epoch with its address's failed authentications; its request budget). A
redis-py client is safe to share between threads: it takes a connection from
its pool for each command. `config/settings.py` puts this backend in place of
Django's when `CACHE_URL` names Redis.
"""

from __future__ import annotations

from django.core.cache.backends.redis import RedisCache as DjangoRedisCache
from django.core.cache.backends.redis import RedisCacheClient


class _PooledClients(RedisCacheClient):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._clients: dict[object, object] = {}

    def get_client(self, key=None, *, write=False):
        pool = self._get_connection_pool(write)
        client = self._clients.get(pool)
        if client is None:
            client = self._clients[pool] = self._client(connection_pool=pool)
        return client


class RedisCache(DjangoRedisCache):
    def __init__(self, server, params) -> None:
        super().__init__(server, params)
        self._class = _PooledClients
