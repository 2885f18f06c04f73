"""Database connections of short-lived threads, handed on to the next ones.

Django keeps a connection per thread. LangGraph runs a checkpoint store's
writes (and nodes that run at once, and Functional API tasks) on the threads
of an executor it creates for every `graph.stream` call and shuts down at its
end (a worker keeps the outermost one of a run from run to run,
runs.graph_executor, and its threads keep what they bind; a subgraph's is
still new); the runs' leases are renewed on one thread of the process
(runs.execution.Leases), which takes a connection only while renewing. Left
to Django, each of these threads opens a Postgres session of its own and
closes it (or leaves it to the garbage collector) when it ends: a few new
sessions for every run.

`bind()` gives the calling thread one connection for its whole life and, when
the thread ends, puts it on a shelf of idle connections for the process, from
which the next thread takes it. What the
shelf hands out is checked as Django checks a persistent connection between
requests (`close_if_unusable_or_obsolete`: past CONN_MAX_AGE it is closed,
after errors it is tested, and with CONN_HEALTH_CHECKS it is tested before
its first query); a connection from Django's pool goes back to the pool
instead, and CONN_MAX_AGE = 0 closes it. A connection is used by one thread
at a time: the shelf takes it back only once its thread has ended.

A connection that a thread other than the main one opens without `bind()`
(node code on an executor thread, say) is handed on the same way when the
thread ends, instead of being left to the garbage collector.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.signals import connection_created

logger = logging.getLogger(__name__)

# Idle connections kept per database alias and process: as many as the
# threads of a fresh LangGraph pool (ThreadPoolExecutor's default size, which
# `get_executor_for_config` takes when `max_concurrency` is unset), so that a
# pool's threads, ending, leave theirs for the next pool's. A shelf of 4
# closed two sessions at the end of every `graph.invoke` on a 2-core machine
# (6 threads) and the next invoke opened two (17 sessions over 6 invokes of
# the 200-step chat of bench/checkpoints.py, 7 with this size). Each closed
# session also left the heap page it was filling in each table it inserted
# into part-filled for good (Postgres fills a page per session and records
# free space only for pages a session gives up as full): the chat's
# pending-write heap took 93-97 KB a thread instead of 84-85 KB.
# A worker process executes one run at a time, on its kept pool
# (runs.graph_executor); this shelf serves the threads of other pools.
SHELF_SIZE = min(32, (os.cpu_count() or 1) + 4)

_lock = threading.Lock()
_shelf: dict[str, list] = {}
# Connections a forked child inherited: the parent's sessions, never to be
# used, closed or garbage collected (which would end them) by the child.
_inherited: list = []
_held = threading.local()


class _Hold:
    """This thread's connection; back to the shelf when the thread ends
    (CPython drops a thread's `threading.local` values as it exits)."""

    def __init__(self, wrapper) -> None:
        self.wrapper = wrapper

    def __del__(self) -> None:
        try:
            _put_back(self.wrapper)
        except Exception:  # never raise out of a finished thread
            logger.debug("could not shelve a thread's connection", exc_info=True)


def bind(alias: str = DEFAULT_DB_ALIAS) -> None:
    """Give this thread a connection off the shelf (or a new one) that goes
    back on it when the thread ends; nothing if the thread has one."""
    if any(c.alias == alias for c in connections.all(initialized_only=True)):
        return
    hold = getattr(_held, alias, None)
    if hold is None:
        wrapper = _take(alias)
        if wrapper is None:
            wrapper = connections.create_connection(alias)
            # Used by one thread at a time, but not always the one that made it.
            wrapper.inc_thread_sharing()
        hold = _Hold(wrapper)
        setattr(_held, alias, hold)
    connections[alias] = hold.wrapper


def _hold_opened(sender, connection, **kwargs) -> None:
    """A connection opened by a thread that took none: shelved at its end."""
    if threading.current_thread() is threading.main_thread():
        return  # a process's own connection, closed by Django's rules
    if connection.settings_dict.get("OPTIONS", {}).get("pool"):
        # A pooling process (the web tier): Django returns the connection to
        # its pool at the end of each request, and keeps checking that no
        # other thread uses it.
        return
    if getattr(_held, connection.alias, None) is not None:
        return  # this thread's, reconnecting
    if not any(c is connection for c in connections.all(initialized_only=True)):
        return  # another thread's, shared with this one
    connection.inc_thread_sharing()
    setattr(_held, connection.alias, _Hold(connection))


connection_created.connect(_hold_opened, dispatch_uid="runs.thread_connections")


def release(alias: str = DEFAULT_DB_ALIAS) -> None:
    """Give this thread's connection back now, for a thread that is about to
    end but may linger (a daemon thread, or one a test keeps)."""
    hold = getattr(_held, alias, None)
    if hold is None:
        return
    if any(c is hold.wrapper for c in connections.all(initialized_only=True)):
        del connections[alias]  # this thread lets go of it too
    delattr(_held, alias)
    del hold  # the last reference: _Hold.__del__ shelves the connection


def _take(alias: str):
    with _lock:
        shelf = _shelf.get(alias)
        wrapper = shelf.pop() if shelf else None
    if wrapper is not None:
        # What Django does to a persistent connection at each request.
        wrapper.close_if_unusable_or_obsolete()
    return wrapper


def _obsolete(wrapper) -> bool:
    return wrapper.close_at is not None and time.monotonic() >= wrapper.close_at


def _put_back(wrapper) -> None:
    if wrapper.connection is None:
        return
    keep = (
        getattr(wrapper, "pool", None) is None  # a pool takes its own back
        and not wrapper.in_atomic_block
        and wrapper.get_autocommit() == wrapper.settings_dict["AUTOCOMMIT"]
        and not _obsolete(wrapper)
    )
    if keep:
        with _lock:
            shelf = _shelf.setdefault(wrapper.alias, [])
            if len(shelf) < SHELF_SIZE:
                shelf.append(wrapper)
                return
    wrapper.close()


def close_all() -> None:
    """Close the shelved connections (at exit: the server sees a clean end)."""
    with _lock:
        wrappers = [w for shelf in _shelf.values() for w in shelf]
        _shelf.clear()
    for wrapper in wrappers:
        try:
            wrapper.close()
        except Exception:
            logger.debug("could not close a shelved connection", exc_info=True)


def shelved(alias: str = DEFAULT_DB_ALIAS) -> int:
    with _lock:
        return len(_shelf.get(alias, ()))


def _forget_after_fork() -> None:
    global _lock
    _lock = threading.Lock()
    for shelf in _shelf.values():
        _inherited.extend(shelf)
    _shelf.clear()


atexit.register(close_all)
os.register_at_fork(after_in_child=_forget_after_fork)
