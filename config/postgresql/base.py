"""Django's Postgres backend with the limits of server-side binding.

With server-side binding (config.settings) psycopg sends a statement's
parameters apart from its SQL, and Postgres' protocol takes at most 65535 of
them per statement; libpq refuses more before sending anything. Django 5.2
does not batch for Postgres (it inlined parameters before psycopg 3), so
this backend declares the limit where Django asks for one: bulk_create,
bulk_update, a deletion's collected rows and in_bulk() then go in batches
that fit. A filter on an unbounded `__in` list is still one statement: pass
one array parameter (`= ANY(%s)`) or a subquery instead (runs.storage).

It also checks a reused connection's health (CONN_HEALTH_CHECKS) without a
round trip when it can (`close_if_health_check_failed`), and runs a commit's
wake-ups before its other on-commit callbacks (runs.wakeups).
"""

from __future__ import annotations

import select
import time

import psycopg
from django.db.backends.postgresql import base, features, operations
from django.db.utils import DatabaseErrorWrapper
from django.utils.functional import cached_property
from psycopg.pq import TransactionStatus

from runs import wakeups
from runs.outages import mark_connection_kept

# Postgres' wire protocol counts a statement's parameters in 16 bits.
MAX_QUERY_PARAMS = 65535

# Seconds since its last use after which a quiet connection is still checked
# with Django's `SELECT 1`. A TCP connection dropped in silence (a NAT or load
# balancer forgetting an idle flow, a failover that fences the old primary's
# network) leaves nothing to read, and the longer a connection sat idle the
# likelier it is to be such a victim; a hot one, used moments ago, saves the
# round trip.
QUIET_MAX_IDLE = 5.0


class DatabaseFeatures(features.DatabaseFeatures):
    max_query_params = MAX_QUERY_PARAMS


class DatabaseOperations(operations.DatabaseOperations):
    def bulk_batch_size(self, fields, objs):
        """Rows per statement: each field may take two parameters (bulk_update
        sends `WHEN pk THEN value` for every field of every row)."""
        if not fields:
            return len(objs)
        return max(1, min(len(objs), MAX_QUERY_PARAMS // (2 * len(fields))))


class _ErrorWrapper(DatabaseErrorWrapper):
    """Tells, in the thread that ran the statement, a statement refused by
    libpq (the connection still good) from a lost connection: psycopg raises
    both as OperationalError without a SQLSTATE (runs.outages)."""

    def __exit__(self, exc_type, exc_value, traceback):
        if (
            isinstance(exc_value, psycopg.OperationalError)
            and exc_value.sqlstate is None
            and self.wrapper.connection is not None
            and not self.wrapper.connection.closed
        ):
            mark_connection_kept(exc_value)
        return super().__exit__(exc_type, exc_value, traceback)


class DatabaseWrapper(base.DatabaseWrapper):
    features_class = DatabaseFeatures
    ops_class = DatabaseOperations

    # When the connection was last used (time.monotonic()): when it last
    # gave a cursor, as Django takes one for each query; a commit or a long
    # query after it only makes the connection look idler than it is, and
    # then checked. Set after the health check of the query it is for.
    # Never used: idle for ever.
    last_used = float("-inf")

    def create_cursor(self, name=None):
        self.last_used = time.monotonic()
        return super().create_cursor(name)

    @cached_property
    def wrap_database_errors(self):
        return _ErrorWrapper(self)

    def run_and_clear_commit_hooks(self):
        """A commit's wake-ups (a run's task, a run's end) before its other
        callbacks, the announcements of its audit events (runs.wakeups)."""
        wakeups.woken_first(self.run_on_commit)
        super().run_and_clear_commit_hooks()

    def close_if_health_check_failed(self):
        """CONN_HEALTH_CHECKS without a round trip for a connection that is
        quiet: used in the last QUIET_MAX_IDLE seconds, idle, held good by
        psycopg, and with nothing to read on its socket. A session the server
        ended (a restart, a failover's fencing, pg_terminate_backend, an idle
        timeout) has told the socket so (its FATAL message, the close): that,
        anything else unread, a session psycopg saw break, or one idle longer
        goes through Django's `SELECT 1` as before. What neither sees (a peer
        gone without a word within those seconds) fails the first statement,
        as it would fail a `SELECT 1`. Saves a round trip on each hot reused
        connection's first query: every task a busy worker runs, the claim's
        first (runs.execution)."""
        if (
            self.connection is not None
            and self.health_check_enabled
            and not self.health_check_done
            and not self.pool
            and time.monotonic() - self.last_used < QUIET_MAX_IDLE
            and _quiet(self.connection)
        ):
            self.health_check_done = True
            return
        super().close_if_health_check_failed()


def _quiet(connection: psycopg.Connection) -> bool:
    if (
        connection.closed
        or connection.broken
        or connection.info.transaction_status != TransactionStatus.IDLE
    ):
        return False
    try:
        poller = select.poll()
        poller.register(connection.fileno(), select.POLLIN | select.POLLPRI)
        # Readable, hung up or in error: not quiet (POLLHUP and POLLERR are
        # reported whether asked for or not).
        return not poller.poll(0)
    except (OSError, ValueError, psycopg.Error):
        return False
