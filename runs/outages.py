"""Outages of the services Gatehouse stands on: telling them from failures.

A lost database connection (Postgres restarted, a failover, a network cut)
or an unreachable broker is not the agent's failure, nor the client's: the
work is retried once the service is back (workers, beat), or the client is
told to come back (`503` with `Retry-After`, runs.api.errors). Only errors
that say the service itself is unavailable count; a query that is wrong
stays an error everywhere.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import kombu.exceptions
import psycopg
import redis.exceptions
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, InterfaceError, OperationalError, connections

logger = logging.getLogger(__name__)
T = TypeVar("T")

# What a client is told to wait before retrying during an outage.
RETRY_AFTER_SECONDS = 5

# Raised by Django, or by psycopg itself where a hot path uses its cursor.
DATABASE_ERRORS = (
    OperationalError,
    InterfaceError,
    psycopg.OperationalError,
    psycopg.InterfaceError,
)

# SQLSTATE classes of a Postgres error that is about the server, not the
# query: connection exceptions (08), the server shutting down or starting
# (57P01-57P03), and a transaction rolled back by a conflict (40: retrying it
# is what the server asks). psycopg raises the base OperationalError, with
# no SQLSTATE, when the connection itself broke, and also when libpq refused
# to send a statement (more than 65535 parameters) on a good connection:
# the backend (config.postgresql) marks the second kind where it is raised,
# the only place that knows which connection it came from. An unmarked one
# (psycopg's own cursor on a hot path, a pool timeout) stays an outage.
_TRANSIENT_SQLSTATES = ("08", "57P", "40")
_CONNECTION_KEPT = "gatehouse_connection_kept"

# The broker (Celery's publish failures) and Redis used directly (the run
# stream, a Redis cache).
BROKER_ERRORS = (
    kombu.exceptions.OperationalError,
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
)


def _chain(error: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def mark_connection_kept(error: BaseException) -> None:
    """The connection that raised `error` is still good: not an outage."""
    setattr(error, _CONNECTION_KEPT, True)


def _database_unavailable(error: BaseException) -> bool:
    if isinstance(error, (InterfaceError, psycopg.InterfaceError)):
        return True  # "connection already closed"
    if isinstance(error, psycopg.OperationalError):
        # The pool's timeout too (PoolTimeout): no connection to be had.
        if error.sqlstate is None:
            return not getattr(error, _CONNECTION_KEPT, False)
        return error.sqlstate.startswith(_TRANSIENT_SQLSTATES)
    if isinstance(error, sqlite3.OperationalError):
        return "locked" in str(error) or "busy" in str(error)
    # Django's OperationalError is judged by the driver's error it wraps,
    # the next link of the chain.
    return False


def is_database_outage(error: BaseException) -> bool:
    """The database could not be reached, or dropped the connection."""
    return any(_database_unavailable(link) for link in _chain(error))


def is_broker_outage(error: BaseException) -> bool:
    return any(isinstance(link, BROKER_ERRORS) for link in _chain(error))


def is_outage(error: BaseException) -> bool:
    return is_database_outage(error) or is_broker_outage(error)


def reconnect(using: str = DEFAULT_DB_ALIAS) -> None:
    """Drop this thread's connection; the next query opens a new one.

    Not inside a transaction: its work is lost with the connection, so it is
    the outermost caller that retries it."""
    connection = connections[using]
    if not connection.in_atomic_block:
        connection.close()


def through_outages(
    operation: Callable[[], T], *, what: str, using: str = DEFAULT_DB_ALIAS
) -> T:
    """`operation()`, called again while the database is unavailable.

    Each attempt runs on a fresh connection, with a growing pause between
    attempts, for up to GATEHOUSE_OUTAGE_RETRY_SECONDS; then the outage's
    error is raised. Only for operations that are safe to repeat (an upsert,
    a transaction that checks what it changes), and never inside a
    transaction, where the outermost caller must retry instead.
    """
    deadline = None  # set by the first failure: the hot path reads nothing
    pause = 0.2
    while True:
        try:
            return operation()
        except DATABASE_ERRORS as error:
            if deadline is None:
                deadline = time.monotonic() + settings.GATEHOUSE_OUTAGE_RETRY_SECONDS
            if (
                not is_database_outage(error)
                or connections[using].in_atomic_block
                or time.monotonic() + pause > deadline
            ):
                raise
            logger.warning(
                "%s: the database is unavailable (%s); retrying in %.1fs",
                what,
                type(error.__cause__ or error).__name__,
                pause,
            )
        reconnect(using)
        time.sleep(pause)
        pause = min(pause * 2, 2.0)
