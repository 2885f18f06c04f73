"""Database connections are kept from run to run, not opened for each.

Celery's Django fixup would close a worker's connections around every task
(config.settings CELERY_DB_REUSE_MAX, config.celery), and LangGraph writes
checkpoints on executor threads that are new for every run, which would each
open a session of their own (runs.thread_connections).
"""

from __future__ import annotations

import select
import threading
import time

import psycopg
import pytest
from django.conf import settings
from django.db import connection, connections
from django.test import override_settings
from langchain_core.runnables.config import ContextThreadPoolExecutor

from config.postgresql import base as postgresql_base
from runs import thread_connections
from runs.models import Run
from tests.factories import tenant_with_client
from tests.workers import Worker, suite_database_url, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def _sessions_opened() -> int:
    """Sessions ever opened to the test database (pg_stat_database)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT sessions FROM pg_stat_database WHERE datname = current_database()"
        )
        return cursor.fetchone()[0]


def _in_a_thread(work):
    """`work()` on a new thread bound to a connection as LangGraph's executor
    threads are (by the checkpoint store); its result once the thread ended."""
    result = {}

    def target():
        thread_connections.bind()
        result["value"] = work()

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    return result["value"]


def _backend_pid():
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def _terminate(pid: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    wait_for(lambda: not _alive(pid), what=f"backend {pid} to end")


def _alive(pid: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid])
        return cursor.fetchone()[0] == 1


def test_a_thread_takes_the_connection_a_finished_thread_left():
    first = _in_a_thread(_backend_pid)
    assert thread_connections.shelved() == 1
    assert _in_a_thread(_backend_pid) == first
    assert thread_connections.shelved() == 1
    assert first != _backend_pid()  # never this thread's own connection


def test_a_connection_a_thread_opened_by_itself_is_handed_on_too():
    """Node code on an executor thread may query without bind(): its
    connection is shelved when the thread ends, not left to the collector."""

    def unbound():
        pid = _backend_pid()
        assert thread_connections.shelved() == 0
        return pid

    result = {}
    thread = threading.Thread(target=lambda: result.update(pid=unbound()))
    thread.start()
    thread.join()
    assert thread_connections.shelved() == 1
    assert _in_a_thread(_backend_pid) == result["pid"]


def test_threads_alive_at_once_have_connections_of_their_own():
    started, done = threading.Barrier(3), threading.Event()
    pids = []

    def work():
        pids.append(_backend_pid())
        started.wait(timeout=10)
        done.wait(timeout=10)

    threads = [
        threading.Thread(target=lambda: (thread_connections.bind(), work()))
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    started.wait(timeout=10)
    assert len(set(pids)) == 2
    done.set()
    for thread in threads:
        thread.join()
    assert thread_connections.shelved() == 2


def test_the_shelf_keeps_a_few_and_closes_the_others():
    count = thread_connections.SHELF_SIZE + 2
    started, done = threading.Barrier(count + 1), threading.Event()
    pids = []

    def work():
        thread_connections.bind()
        pids.append(_backend_pid())
        started.wait(timeout=10)
        done.wait(timeout=10)

    threads = [threading.Thread(target=work) for _ in range(count)]
    for thread in threads:
        thread.start()
    started.wait(timeout=10)
    done.set()
    for thread in threads:
        thread.join()
    assert thread_connections.shelved() == thread_connections.SHELF_SIZE
    wait_for(
        lambda: sum(_alive(pid) for pid in pids) == thread_connections.SHELF_SIZE,
        what="the connections beyond the shelf to be closed",
    )


def test_a_fresh_pools_threads_leave_their_connections_to_the_next_pool():
    """LangGraph opens a pool of its default size for every `graph.invoke`
    outside a worker: all its threads' connections wait on the shelf for the
    next pool's (a shelf smaller than the pool closed the rest, and the next
    pool opened as many, each leaving a part-filled heap page behind)."""

    def fill_a_pool() -> set[int]:
        pool = ContextThreadPoolExecutor()
        size = pool._max_workers
        started = threading.Barrier(size)

        def work():
            thread_connections.bind()
            started.wait(timeout=10)  # all the pool's threads busy at once
            return _backend_pid()

        with pool:
            pids = {f.result() for f in [pool.submit(work) for _ in range(size)]}
        assert len(pids) == size
        return pids

    first = fill_a_pool()
    assert thread_connections.shelved() == len(first)
    opened = _sessions_opened()
    assert fill_a_pool() == first
    assert _sessions_opened() == opened


def test_a_shelved_connection_that_died_is_replaced_before_its_first_query():
    first = _in_a_thread(_backend_pid)
    _terminate(first)  # a Postgres restart, a failover, an idle timeout
    second = _in_a_thread(_backend_pid)  # CONN_HEALTH_CHECKS: no error
    assert second != first


def _observer() -> psycopg.Connection:
    """A session of its own, beside any thread's: what the server sees."""
    return psycopg.connect(suite_database_url(), autocommit=True)


def _last_statement(observer: psycopg.Connection, pid: int) -> str | None:
    """What the session `pid` was last asked to run, as the server saw it."""
    observer.execute("SELECT pg_stat_clear_snapshot()")
    row = observer.execute(
        "SELECT query FROM pg_stat_activity WHERE pid = %s", [pid]
    ).fetchone()
    return row and row[0]


def _health_checked(observer: psycopg.Connection, before=None):
    """On a new thread, a connection used once and then checked as Django
    checks a reused one before a task or request (CONN_HEALTH_CHECKS): its
    backend pid, and whether the check kept it. `before(pid)` runs between
    the use and the check."""
    assert connections["default"].health_check_enabled

    def work():
        wrapper = connections["default"]
        with wrapper.cursor() as cursor:
            cursor.execute("SELECT 'used before the check'")
        pid = wrapper.connection.info.backend_pid
        if before is not None:
            before(pid)
        wrapper.close_if_unusable_or_obsolete()  # what each task starts with
        wrapper.close_if_health_check_failed()  # the check, before a query
        return pid, wrapper.connection is not None

    return _in_a_thread(work)


def test_a_quiet_reused_connection_is_health_checked_without_a_round_trip():
    """config.postgresql: idle, and nothing to read on its socket."""
    with _observer() as observer:
        pid, kept = _health_checked(observer)
        assert kept
        # The server saw no `SELECT 1` after the connection's last use.
        assert _last_statement(observer, pid) == "SELECT 'used before the check'"


def test_a_quiet_connection_idle_past_its_bound_is_checked_by_a_statement(
    monkeypatch,
):
    """A peer gone without a word (a NAT dropping an idle flow) leaves nothing
    to read: a connection idle longer than QUIET_MAX_IDLE gets Django's
    `SELECT 1` all the same (the bound shortened from 5 s, for the test)."""
    monkeypatch.setattr(postgresql_base, "QUIET_MAX_IDLE", 0.2)
    with _observer() as observer:
        pid, kept = _health_checked(observer, before=lambda pid: time.sleep(0.3))
        assert kept  # the session is good
        assert _last_statement(observer, pid) == "SELECT 1"


def test_a_reused_connection_with_something_to_read_is_checked_by_a_statement():
    with _observer() as observer:

        def notify(pid):
            with connections["default"].cursor() as cursor:
                cursor.execute("LISTEN gatehouse_health")
            observer.execute("NOTIFY gatehouse_health")
            # Wait until the notification has reached the socket (not a fixed
            # sleep: a loaded machine may deliver it late).
            socket = connections["default"].connection.fileno()
            readable, _, _ = select.select([socket], [], [], 10)
            assert readable, "the NOTIFY never reached the connection's socket"

        pid, kept = _health_checked(observer, before=notify)
        assert kept  # the session is good
        # Django's check, sent since the socket had something to say.
        assert _last_statement(observer, pid) == "SELECT 1"


def test_a_reused_connection_the_server_ended_is_closed_by_its_check():
    with _observer() as observer:

        def terminate(pid):  # a Postgres restart, a failover, an idle timeout
            observer.execute("SELECT pg_terminate_backend(%s)", [pid])
            wait_for(
                lambda: _last_statement(observer, pid) is None,
                what=f"backend {pid} to end",
            )

        pid, kept = _health_checked(observer, before=terminate)
        assert not kept


def test_a_connection_past_its_max_age_is_closed_not_shelved(monkeypatch):
    monkeypatch.setitem(connections.settings["default"], "CONN_MAX_AGE", 0)
    first = _in_a_thread(_backend_pid)
    assert thread_connections.shelved() == 0
    wait_for(lambda: not _alive(first), what="the connection to be closed")


def test_a_thread_that_lets_go_of_its_connection_early_shelves_it():
    def work():
        pid = _backend_pid()
        thread_connections.release()
        return pid, thread_connections.shelved()

    pid, shelved = _in_a_thread(work)
    assert shelved == 1
    assert _in_a_thread(_backend_pid) == pid


FAN_OUT = "fanout@1=tests.agents:fan_out_graph"


@pytest.mark.worker
def test_a_worker_opens_no_session_per_run(_worker_process):
    """Runs on a warm worker open no Postgres session of their own: the
    worker's connections outlive its tasks, and the threads of LangGraph's
    executor (the checkpoint store's writes, nodes that run at once and
    record values) are kept from run to run with theirs (runs.graph_executor).
    (Before: three or four per run of one node, three more for three nodes
    at once.)

    The kept pool still starts a thread when a task finds none idle, up to
    its size, and that thread opens a session once: how many it reaches
    depends on timing, not on the number of runs. So the sessions 20 runs
    open are bounded by the pool's size, where one per run would be 20."""
    _, api = tenant_with_client()
    agents = f"{settings.GATEHOUSE_AGENTS},{FAN_OUT}"

    def run(agent: str, index: int) -> None:
        thread_id = f"{agent}-{index}"
        api.post(
            "/api/v1/threads", {"thread_id": thread_id, "agent": agent}, format="json"
        )
        run_id = api.post(
            f"/api/v1/threads/{thread_id}/runs",
            {"input": {"text": "hi"} if agent == "echo" else {}},
            format="json",
        ).json()["run_id"]
        wait_for(
            lambda: Run.objects.get(pk=run_id).status not in Run.ACTIVE,
            what=f"run {thread_id} to end",
        )
        assert Run.objects.get(pk=run_id).status == Run.Status.SUCCEEDED

    # One pool process, so that the warm-up warms the process that runs the
    # rest; connections that outlive the test (DATABASE_CONN_MAX_AGE).
    _worker_process.stop()
    worker = Worker(
        name="conns",
        concurrency=1,
        env={"DATABASE_CONN_MAX_AGE": "600", "GATEHOUSE_AGENTS": agents},
    )
    try:
        with override_settings(GATEHOUSE_AGENTS=agents):
            for index in range(2):
                run("echo", index)
                run("fanout", index)
            before = _sessions_opened()
            for index in range(2, 12):
                run("echo", index)
                run("fanout", index)
            opened = _sessions_opened() - before
    finally:
        worker.stop()
        _worker_process.__init__(name="main")
    # The worker's pool has this size on this machine; the warm-up's runs
    # used at least one of its threads, whose session is not counted.
    pool_size = ContextThreadPoolExecutor()._max_workers
    assert opened < pool_size, f"{opened} sessions opened by 20 runs"
