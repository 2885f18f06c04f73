"""A run's LangGraph background threads, kept from run to run.

LangGraph's sync loop enters a BackgroundExecutor for every `graph.stream`:
a new thread pool (langchain_core's `get_executor_for_config`) whose threads
start with the run's first checkpoint write and are joined when the run ends.
Starting and joining them cost about 0.4 ms of CPU and 1-2 ms of wall time
per run on a 2-core machine, and each new thread took a database connection
off the shelf of idle ones (runs.thread_connections).

Inside `kept_pool()`, the next loop opened on the calling thread takes a pool
kept for that thread instead, used as its own: LangGraph waits for its tasks
at the loop's end as before, and the loop's end waits for everything
submitted through it, as the pool's shutdown did. One pool per calling
thread (a worker process's one), so no other run shares it. Only the
outermost loop takes it: a subgraph's loop, inside a node (on this thread or
on one of the pool's), opens a pool of its own as before, so that no node
waits on a subgraph for a thread of the pool it occupies; so does a config
with a `max_concurrency` of its own.

The pool's threads keep their database connections between runs, as a
worker's own thread does between tasks, and Django's rule for that applies
at each run's first task on each of them (`close_old_connections`: closed
past CONN_MAX_AGE or after an error that broke it, health-checked before its
next query), as the shelf applies it to a connection it hands out.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future
from concurrent.futures import wait as wait_until_done
from contextlib import contextmanager
from typing import Any

from django.db import close_old_connections
from langchain_core.runnables.config import ContextThreadPoolExecutor
from langgraph.pregel import _executor as langgraph_executor

_fresh_executor_for_config = langgraph_executor.get_executor_for_config
_state = threading.local()  # per calling thread: `offered`, `pool`
_runs = itertools.count(1)
_pool_thread = threading.local()  # per pool thread: `run`, the last it served


@contextmanager
def kept_pool() -> Iterator[None]:
    """The next LangGraph loop opened on this thread, inside the block, runs
    its background work on this thread's kept pool."""
    _state.offered = True
    try:
        yield
    finally:
        _state.offered = False


@contextmanager
def _executor_for_config(config) -> Iterator[Executor]:
    if (
        not getattr(_state, "offered", False)
        or (config or {}).get("max_concurrency") is not None
    ):
        with _fresh_executor_for_config(config) as executor:
            yield executor
        return
    _state.offered = False  # taken: a loop nested in this one opens its own
    pool = getattr(_state, "pool", None)
    if pool is None:
        # The size a fresh pool has (max_concurrency unset).
        pool = _state.pool = ContextThreadPoolExecutor()
    run = _RunExecutor(pool)
    try:
        yield run
    finally:
        run.wait_for_all()


class _RunExecutor(Executor):
    """One run's view of the kept pool: its submissions, waited for at the end."""

    def __init__(self, pool: ContextThreadPoolExecutor) -> None:
        self._pool = pool
        self._run = next(_runs)
        self._futures: list[Future] = []

    def submit(self, fn: Callable, /, *args: Any, **kwargs: Any) -> Future:
        future = self._pool.submit(_in_run, self._run, fn, *args, **kwargs)
        self._futures.append(future)
        return future

    def wait_for_all(self) -> None:
        # Tasks may submit more while others finish: until none is left.
        while pending := [f for f in self._futures if not f.done()]:
            wait_until_done(pending)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        if cancel_futures:
            for future in self._futures:
                future.cancel()
        if wait:
            self.wait_for_all()


def _in_run(run: int, fn: Callable, /, *args: Any, **kwargs: Any) -> Any:
    if getattr(_pool_thread, "run", None) != run:
        # This thread's first task of the run: its connection is checked as
        # a persistent connection is at each request.
        close_old_connections()
        _pool_thread.run = run
    return fn(*args, **kwargs)


def shut_down() -> None:
    """Stop this thread's kept pool: its threads end, and their connections
    go on the shelf (runs.thread_connections) as any ending thread's do."""
    pool, _state.pool = getattr(_state, "pool", None), None
    if pool is not None:
        pool.shutdown(wait=True)


def _forget_after_fork() -> None:
    # The parent's pool threads do not exist in a forked child.
    _state.pool = None
    _state.offered = False


# What BackgroundExecutor calls (a name of its module, looked up per call).
langgraph_executor.get_executor_for_config = _executor_for_config
os.register_at_fork(after_in_child=_forget_after_fork)
