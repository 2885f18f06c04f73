"""kombu's Redis transport, with a channel that keeps the client it sends with.

kombu's Redis channel makes a new redis.Redis client, on the channel's
connection pool, for each message it publishes (Channel.conn_or_acquire);
making one fills its table of response callbacks (~170 entries): ~0.1 ms of
CPU, a sixth of a task's send, which a web request pays between its commit
and its answer (runs.dispatch). This channel makes it once. A client is
only the pool and that table: redis-py's clients are shared between threads
(each command takes a connection from the pool), and the pool starts afresh
in a forked process. config.settings names this transport for a redis://
broker (CELERY_BROKER_TRANSPORT).
"""

from __future__ import annotations

from contextlib import contextmanager
from functools import cached_property

from kombu.transport import redis


class Channel(redis.Channel):
    @cached_property
    def _kept_client(self):
        return self._create_client()

    @contextmanager
    def conn_or_acquire(self, client=None):
        yield client if client else self._kept_client


class Transport(redis.Transport):
    Channel = Channel
