"""Run stream events: what the worker executing a run publishes, in order, for
web processes to relay as Server-Sent Events and for waiting calls to wake on.

A run's events form one ordered log. Each event has

- an id, ``"<attempt>-<seq>"``: the claim attempt that published it (a run
  taken over after its worker was lost publishes under the next attempt) and
  its place within that attempt. Ids only grow, so a client that reconnects
  with ``Last-Event-ID`` gets exactly the events after the last one it saw;
- a name: ``metadata`` first (the run id and the attempt), then LangGraph's
  stream parts as the graph yields them (``values``, ``updates``, ``messages``
  for the messages-tuple mode, ``custom``, ``debug``, ``tasks``,
  ``checkpoints``; ``<mode>|<namespace>`` from a subgraph), and last ``end``,
  whose data is the run's outcome (status, final values, error);
- data: JSON, encrypted with the thread's key and bound to the run and the
  event id (`row = ("stream-event", run id, attempt, seq)`). Stream events
  carry what the agent and the user wrote: they are never stored in clear,
  not even in Redis, and a shredded thread's events are unreadable at once.

Where the log lives (``GATEHOUSE_STREAM_URL``):

- a Redis stream per run (``gh:run:<run id>:events``) in production: the
  worker appends with ``XADD`` under the event's own id, so an attempt that
  lost its lease to a newer one can no longer append; readers block in
  ``XREAD`` and wake the moment an event lands. The run's thread writes an
  event without waiting for Redis's reply, read later (runs.stream_sender);
- ``RunStreamEvent`` rows in the embedded mode (no Redis), which readers
  poll every ``POLL_INTERVAL`` seconds.

Events expire ``GATEHOUSE_STREAM_TTL_SECONDS`` after a run's last event (Redis
key expiry; the `runs.expire_stream_events` beat job for rows).
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import redis
import redis.asyncio
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connection
from django.db.models import Q
from django.utils import timezone

from runs import outages
from runs.crypto import ThreadCipher
from runs.models import Run, RunStreamEvent
from runs.selectors import jsonable
from runs.stream_sender import Sender

logger = logging.getLogger(__name__)

METADATA = "metadata"
END = "end"
DATABASE = "database"
# How often a reader of the database backend looks for new rows.
POLL_INTERVAL = 0.05
# Events read at most per round trip.
BATCH = 500


@dataclass(frozen=True, order=True)
class EventId:
    attempt: int
    seq: int

    def __str__(self) -> str:
        return f"{self.attempt}-{self.seq}"

    @classmethod
    def parse(cls, text: str | None) -> EventId | None:
        """The id a client sent back (Last-Event-ID); None if it is not one."""
        attempt, dash, seq = (text or "").strip().partition("-")
        if not dash or not attempt.isdigit() or not seq.isdigit():
            return None
        return cls(int(attempt), int(seq))


# Before every event: reading after it reads the whole log. Attempts start at 1.
START = EventId(0, 0)


@dataclass(frozen=True)
class StreamEvent:
    id: EventId
    name: str
    data: bytes | None  # JSON; None when read without the cipher (names only)
    # An `end`'s copy of its run's columns (`ended_columns`), if it has one.
    ended: dict | None = None


# The run's own columns an error-free `end` carries beside its data, in
# clear as its row has them (no agent's or user's content): a waiting GET
# answers the run from them, with no hop to its thread, connection or
# statement after the wake (runs.api.views). A failed run's end has none: its
# answer reads the error, and audits that read, from its row. The database
# log keeps no copy (its readers read the row).
ENDED_COLUMNS = ("status", "started_at", "ended_at")


def ended_columns(run: Run) -> bytes | None:
    """The copy an `end` carries of the run's columns, as its end recorded
    them; None for a run whose answer shows an error or a compensation."""
    if run.error is not None or run.compensation:
        return None
    return json.dumps(
        {name: jsonable(getattr(run, name)) for name in ENDED_COLUMNS},
        separators=(",", ":"),
    ).encode()


def as_ended(run: Run, ended: dict) -> Run:
    """`run` (as read before its end) with the columns its `end` carried: the
    row as that end recorded it, its other columns unchanged since (a thread
    deleted meanwhile takes nothing from an error-free run's answer)."""
    current = copy.copy(run)
    current.status = ended["status"]
    for name in ("started_at", "ended_at"):
        moment = ended[name]
        setattr(
            current, name, None if moment is None else datetime.fromisoformat(moment)
        )
    current.error, current.error_type, current.compensation = None, "", ""
    return current


def _row(run_id, event_id: EventId) -> tuple:
    return ("stream-event", str(run_id), event_id.attempt, event_id.seq)


def encode(data: Any) -> bytes:
    return json.dumps(jsonable(data), separators=(",", ":")).encode()


# The client-side bound of a blocked read: above any `idle` a reader passes.
BLOCKED_READ_TIMEOUT = 60.0


class RedisLog:
    def __init__(self, url: str) -> None:
        self.url = url
        self._sync: redis.Redis | None = None
        self._sender: Sender | None = None
        # One client per event loop: an asyncio connection belongs to its loop.
        self._async: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    @staticmethod
    def key(run_id) -> str:
        return f"gh:run:{run_id}:events"

    def _client(self) -> redis.Redis:
        if self._sync is None:
            self._sync = redis.Redis.from_url(self.url)
        return self._sync

    def _async_client(self) -> redis.asyncio.Redis:
        loop = asyncio.get_running_loop()
        client = self._async.get(loop)
        if client is None:
            # A read blocks up to its caller's idle time (XREAD BLOCK); redis-py's
            # own read timeout (5 s by default) would cut it short and raise.
            client = redis.asyncio.Redis.from_url(
                self.url, socket_timeout=BLOCKED_READ_TIMEOUT
            )
            self._async[loop] = client
        return client

    def publish(
        self,
        publisher: Publisher,
        event_id: EventId,
        name: str,
        blob: bytes,
        ended: bytes | None = None,
    ) -> None:
        """XADD the event under its own id (and renew the stream's expiry)
        without waiting for Redis's reply (runs.stream_sender), except for
        the run's end: the run's last event, after which nothing of it is
        left unanswered."""
        if self._sender is None:
            self._sender = Sender(self.url, self._settle)
        key = self.key(publisher.run_id)
        fields = ("e", name, "d", blob) + (() if ended is None else ("r", ended))
        self._sender.send(
            [
                ("XADD", key, str(event_id), *fields),
                ("EXPIRE", key, settings.GATEHOUSE_STREAM_TTL_SECONDS),
            ],
            (publisher, name),
            wait=name == END,
        )

    def flush(self) -> None:
        if self._sender is not None:
            self._sender.flush()

    @staticmethod
    def _settle(token: tuple[Publisher, str], replies: list | BaseException) -> None:
        """An XADD Redis refused for an id not above the stream's last makes
        its publisher stale (a newer attempt owns the log)."""
        publisher, name = token
        if isinstance(replies, BaseException):
            publisher.lost(name, type(replies).__name__)
        elif isinstance(replies[0], redis.ResponseError):
            if "equal or smaller" in str(replies[0]):
                publisher.superseded()
            else:
                publisher.lost(name, str(replies[0]))

    async def read(
        self, run_id, after: EventId, timeout: float
    ) -> list[tuple[EventId, str, bytes, bytes | None]]:
        timeout = min(timeout, BLOCKED_READ_TIMEOUT / 2)
        reply = await self._async_client().xread(
            {self.key(run_id): str(after)},
            count=BATCH,
            block=max(1, int(timeout * 1000)),
        )
        return [
            (
                EventId.parse(entry_id.decode()),
                fields[b"e"].decode(),
                fields[b"d"],
                fields.get(b"r"),
            )
            for _key, entries in reply or ()
            for entry_id, fields in entries
        ]

    async def tail(self, run_id) -> list[tuple[EventId, str]]:
        entries = await self._async_client().xrevrange(self.key(run_id), count=2)
        return [
            (EventId.parse(entry_id.decode()), fields[b"e"].decode())
            for entry_id, fields in entries
        ]


class DatabaseLog:
    def publish(
        self,
        publisher: Publisher,
        event_id: EventId,
        name: str,
        blob: bytes,
        ended: bytes | None = None,
    ) -> None:
        RunStreamEvent.objects.create(
            run_id=publisher.run_id,
            attempt=event_id.attempt,
            seq=event_id.seq,
            event=name,
            data=blob,
        )

    def flush(self) -> None:
        pass

    @staticmethod
    def _rows(run_id, after: EventId) -> list[tuple[EventId, str, bytes, None]]:
        rows = (
            RunStreamEvent.objects.filter(run_id=run_id)
            .filter(
                Q(attempt__gt=after.attempt)
                | Q(attempt=after.attempt, seq__gt=after.seq)
            )
            .order_by("attempt", "seq")
            .values_list("attempt", "seq", "event", "data")[:BATCH]
        )
        found = [
            (EventId(attempt, seq), event, bytes(data), None)
            for attempt, seq, event, data in rows
        ]
        release_connection()  # a reader polls: it holds no connection between
        return found

    @staticmethod
    def _tail(run_id) -> list[tuple[EventId, str]]:
        rows = (
            RunStreamEvent.objects.filter(run_id=run_id)
            .order_by("-attempt", "-seq")
            .values_list("attempt", "seq", "event")[:2]
        )
        return [(EventId(attempt, seq), event) for attempt, seq, event in rows]

    async def tail(self, run_id) -> list[tuple[EventId, str]]:
        return await sync_to_async(self._tail)(run_id)

    async def read(
        self, run_id, after: EventId, timeout: float
    ) -> list[tuple[EventId, str, bytes, None]]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            rows = await sync_to_async(self._rows)(run_id, after)
            remaining = deadline - loop.time()
            if rows or remaining <= 0:
                return rows
            await asyncio.sleep(min(POLL_INTERVAL, remaining))


_logs: dict[str, RedisLog | DatabaseLog] = {}


def log() -> RedisLog | DatabaseLog:
    """The log that GATEHOUSE_STREAM_URL names (one per URL and process)."""
    url = settings.GATEHOUSE_STREAM_URL
    if url not in _logs:
        _logs[url] = DatabaseLog() if url == DATABASE else RedisLog(url)
    return _logs[url]


class Publisher:
    """Publishes one claim attempt's events of a run, in order.

    Once Redis refuses one of its events for an id below the log's last (the
    run was taken over by a newer attempt) it publishes nothing more: the
    newer attempt's worker owns the log.
    """

    def __init__(self, *, run_id, attempt: int, cipher: ThreadCipher) -> None:
        self.run_id = run_id
        self.attempt = attempt
        self.cipher = cipher
        self.seq = 0
        self.stale = False

    def publish(self, name: str, data: Any, ended: bytes | None = None) -> None:
        """Encrypt the event and append it to the log (Redis reports a
        refusal or an outage through `superseded` and `lost`, maybe later);
        an `end` with its run's `ended_columns`."""
        if self.stale:
            return
        event_id = EventId(self.attempt, self.seq)
        self.seq += 1
        blob = self.cipher.encrypt(encode(data), row=_row(self.run_id, event_id))
        log().publish(self, event_id, name, blob, ended)

    def superseded(self) -> None:
        """A newer attempt published: publish nothing more (events already
        written are refused by Redis, their ids being below the newer one's)."""
        if not self.stale:
            logger.warning("run %s: attempt %s is stale", self.run_id, self.attempt)
        self.stale = True

    def lost(self, name: str, why: str) -> None:
        """Redis down: the event is lost to live readers, the run goes on;
        its outcome is in the database, where readers find it too."""
        logger.warning(
            "run %s: stream event %s not published (%s)", self.run_id, name, why
        )


def flush() -> None:
    """Read the replies to the events published so far (runs.stream_sender):
    a stale attempt or a lost event is known once this returns."""
    for each in list(_logs.values()):
        each.flush()


def outcome(
    *,
    status: str,
    values: Any = None,
    interrupts: list | None = None,
    error: dict | None = None,
) -> dict:
    """The data of a run's `end` event: its status, the thread's values when
    it stopped, the interrupts it stopped on, and its error."""
    return {
        "status": status,
        "values": values,
        "interrupts": interrupts or [],
        "error": error,
    }


async def live_start(run_id) -> EventId:
    """Where a reader that wants only what comes from now on starts: after
    the last event, or just before a run's `end` (a late reader still gets
    the end at once)."""
    tail = await log().tail(run_id)
    if not tail:
        return START
    (last_id, last_name), *earlier = tail
    if last_name != END:
        return last_id
    return earlier[0][0] if earlier else START


async def follow(
    *,
    run_id,
    cipher: ThreadCipher | None,
    after: EventId = START,
    idle: float = 5.0,
    until: float | None = None,
) -> AsyncIterator[StreamEvent | None]:
    """The run's events after `after`, as they are published; None after each
    `idle` seconds without one (the caller checks the run then). With `until`
    (the event loop's clock) it stops then. Without a cipher the events carry
    their names only: for a reader that waits for the `end`."""
    loop = asyncio.get_running_loop()
    while True:
        timeout = idle
        if until is not None:
            timeout = min(idle, until - loop.time())
            if timeout <= 0:
                return
        batch = await log().read(run_id, after, timeout)
        if not batch:
            if until is not None and loop.time() >= until:
                return
            yield None
            continue
        for event_id, name, blob, ended in batch:
            after = event_id
            yield StreamEvent(
                id=event_id,
                name=name,
                data=None
                if cipher is None
                else cipher.decrypt(blob, row=_row(run_id, event_id)),
                ended=None if ended is None else json.loads(ended),
            )


def release_connection() -> None:
    """Give the request's database connection back to the web process's pool
    (config/asgi.py) before a reader waits on a run: a client that waits
    holds none, and the next query takes one again. Without a pool (the
    embedded mode's SQLite, a WSGI server) the connection is kept."""
    if getattr(connection, "pool", None) is not None and not connection.in_atomic_block:
        connection.close()


def _stopped(run_id) -> Run | None:
    """The run, with its thread and tenant, once it is no longer queued or
    running; None while it is (and the connection given back: the reader
    waits on)."""
    run = Run.objects.select_related("thread__tenant").get(pk=run_id)
    if run.is_active:
        release_connection()
        return None
    return run


async def until_stopped(
    *,
    run_id,
    cipher: ThreadCipher | None,
    after: EventId,
    idle: float = 5.0,
    until: float | None = None,
) -> AsyncIterator[StreamEvent | Run | None]:
    """The run's events after `after` up to its `end` (it stopped:
    interrupted, succeeded, failed or cancelled); None for each `idle` pause,
    after which the run is looked up, and one found stopped (its `end` not in
    the log: expired, or lost with its worker) is the last item, as a Run.
    With `until` (the event loop's clock) it stops then."""
    async for event in follow(
        run_id=run_id, cipher=cipher, after=after, idle=idle, until=until
    ):
        if event is not None:
            yield event
            if event.name == END:
                return
            continue
        stopped = await sync_to_async(_stopped)(run_id)
        if stopped is not None:
            yield stopped
            return
        yield None


def known_start(run: Run) -> EventId | None:
    """Where a reader of `run` as it was read starts, if the row says it
    without a look at the log's tail (`live_start`, a round trip): the log's
    start for a run read as queued and never claimed, which had published
    nothing then (its first event, the metadata of its first claim, comes
    once the claim has committed; a cancel's end once the run is no longer
    queued; no run is ever queued again), so that all of its log comes
    from then on. None otherwise."""
    if run.status == Run.Status.QUEUED and run.attempts == 0:
        return START
    return None


async def stopped(
    run_id, *, within: float, idle: float = 5.0, after: EventId | None = None
) -> dict | None:
    """Return once the run has stopped or `within` seconds from now, whichever
    comes first, in the web process's event loop (the request's thread stays
    reserved, idle), holding no database connection meanwhile: its caller
    gave the request's connection back first (release_connection, in its
    view: a hop of its own here cost more CPU than the call). It
    reads the events' names, not their content: the caller reads the run
    from the database then, unless its `end` carried the run's columns
    (`ended_columns`), returned then. A log that cannot be read (Redis down)
    ends the wait at once. It reads the log after `after` (`known_start`),
    or, without it, from the log's tail (`live_start`)."""
    until = asyncio.get_running_loop().time() + within
    last = None
    try:
        if after is None:
            after = await live_start(run_id)
        async for item in until_stopped(
            run_id=run_id, cipher=None, after=after, idle=idle, until=until
        ):
            last = item
    except outages.BROKER_ERRORS as error:
        logger.warning("run %s: its events cannot be read (%s)", run_id, error)
        return None
    return last.ended if isinstance(last, StreamEvent) and last.name == END else None


def expire_events(*, batch_size: int = 5000) -> int:
    """Delete the database backend's events past their time to live."""
    cutoff = timezone.now() - timedelta(seconds=settings.GATEHOUSE_STREAM_TTL_SECONDS)
    deleted = 0
    while True:
        pks = list(
            RunStreamEvent.objects.filter(created_at__lt=cutoff).values_list(
                "pk", flat=True
            )[:batch_size]
        )
        if not pks:
            return deleted
        deleted += RunStreamEvent.objects.filter(pk__in=pks).delete()[0]
