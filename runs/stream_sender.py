"""Commands written to Redis at once, their replies read later: a run's
stream events leave in the run's thread without it waiting for the round
trip (runs.streaming.RedisLog).

Why: a Redis round trip per event sat on the run's critical path (the
metadata event between the claim and the first step, each stream chunk
within a step), ~0.3 ms unloaded and 1.5-1.9 ms under load (issue 15). A
background thread to send them was tried and measured worse for readers:
under the GIL it got to send only when the run's thread let go, so the
first event and the end reached the client ~5 ms later (bench/stream.py,
start -> interrupted p50 17.8/19.9 -> 23.7/27.9 ms).

Here the caller writes the commands to one connection (one socket write)
and goes on; Redis executes them in the order they were written, so a run's
events land in the order it published them, and readers see each one as
soon as Redis has it. The replies are read when they are there, at the
next send (without waiting), or all of them when a caller asks to `wait`
(the run's end): that is when a refused event (its attempt stale) or a lost
connection is reported, through the token each send carried.

Bounded: at most PENDING_LIMIT sends may wait for their replies; past that
a send first reads replies, waiting for them (Redis being slow is then the
run's to wait for, as it was for every event before).

One connection per log and process (a lock around it); a forked child (Celery's pool
processes) opens its own: the parent's socket and replies stay the parent's.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

import redis

from runs import outages

logger = logging.getLogger(__name__)

# Sends whose replies may be unread at once.
PENDING_LIMIT = 1000

# What a send's replies are given to: (token, replies or the error that lost them).
Settle = Callable[[Any, "list[Any] | BaseException"], None]

_senders: weakref.WeakSet[Sender] = weakref.WeakSet()


class Sender:
    """Writes commands to Redis (`url`) and hands each send's replies, or the
    connection error that lost them, to `settle` with the send's token."""

    def __init__(self, url: str, settle: Settle) -> None:
        self.url = url
        self._settle = settle
        self._lock = threading.Lock()
        self._reset()
        _senders.add(self)

    def _reset(self) -> None:
        self._connection: redis.connection.AbstractConnection | None = None
        # (token, how many replies) for each send, in order.
        self._pending: deque[tuple[Any, int]] = deque()

    def _connect(self) -> redis.connection.AbstractConnection:
        if self._connection is None:
            pool = redis.ConnectionPool.from_url(self.url)
            self._connection = pool.connection_class(**pool.connection_kwargs)
        elif not self._pending:
            # Readable with nothing asked: closed by the server (a restart, an
            # idle timeout), so reconnect, as a pool does before lending one.
            try:
                closed = self._connection.can_read(timeout=0)
            except outages.BROKER_ERRORS:
                closed = True
            if closed:
                self._connection.disconnect()
        return self._connection

    def send(self, commands: list[tuple], token: Any, *, wait: bool = False) -> None:
        """Write `commands` now; with `wait`, return once their replies (and
        every earlier send's) are read and settled."""
        with self._lock:
            written = False
            try:
                connection = self._connect()
                if len(self._pending) >= PENDING_LIMIT:
                    self._read(wait=True)
                connection.send_packed_command(
                    connection.pack_commands(commands), check_health=False
                )
                self._pending.append((token, len(commands)))
                written = True
                self._read(wait=wait)
            except outages.BROKER_ERRORS as error:
                self._lose(error, unsent=[] if written else [token])

    def flush(self) -> None:
        """Read and settle every reply still unread."""
        with self._lock:
            if not self._pending:
                return
            try:
                self._read(wait=True)
            except outages.BROKER_ERRORS as error:
                self._lose(error)

    def _read(self, *, wait: bool) -> None:
        connection = self._connection
        while self._pending and (wait or connection.can_read(timeout=0)):
            token, count = self._pending[0]
            replies = []
            for _ in range(count):
                try:
                    replies.append(connection.read_response())
                except redis.ResponseError as refused:
                    replies.append(refused)
            self._pending.popleft()
            self._settle(token, replies)

    def _lose(self, error: BaseException, unsent: tuple | list = ()) -> None:
        """The connection failed: what it had not answered is lost."""
        lost = [token for token, _count in self._pending] + list(unsent)
        if self._connection is not None:
            self._connection.disconnect()
        self._reset()
        for each in lost:
            self._settle(each, error)


def flush_all() -> None:
    for sender in list(_senders):
        sender.flush()


def _after_fork_in_child() -> None:
    # The parent's socket, lock and unread replies are the parent's.
    for sender in list(_senders):
        sender._lock = threading.Lock()
        sender._reset()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _connect_worker_shutdown() -> None:
    # A pool process leaves with os._exit (no atexit): replies left unread
    # when a socket closes can make the kernel reset it, dropping what was
    # still to be sent.
    from celery import signals

    @signals.worker_process_shutdown.connect(weak=False)
    def _flush_on_worker_shutdown(**_kwargs) -> None:
        flush_all()


atexit.register(flush_all)
_connect_worker_shutdown()
