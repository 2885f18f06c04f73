import os
import sys
import tempfile
from pathlib import Path

import pytest


def pytest_configure(config):
    """docs/writing-agents.md's examples become an importable package, here and
    in the workers the suite starts (see tests/docs_examples.py)."""
    from tests.docs_examples import write_package

    root = tempfile.mkdtemp(prefix="gatehouse-docs-")
    write_package(Path(root))
    sys.path.insert(0, root)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [root, os.environ.get("PYTHONPATH")])
    )


@pytest.fixture(autouse=True)
def _fresh_throttle_cache():
    """Throttle counters live in the cache; one test's requests must not
    throttle the next's."""
    from django.core.cache import cache

    cache.clear()
    yield


@pytest.fixture(autouse=True)
def _no_shelved_connections():
    """Connections that this process's finished threads (LangGraph's executor,
    a heartbeat) left for the next ones (runs.thread_connections), and those
    of a run's kept pool (runs.graph_executor), are one test's: closed after
    it, or they would outlive the test database. The replies to this
    process's stream events still unread are read (runs.stream_sender)."""
    yield
    from runs import graph_executor, streaming, thread_connections

    streaming.flush()
    graph_executor.shut_down()
    thread_connections.close_all()


@pytest.fixture(scope="session")
def _worker_process(django_db_setup):
    from tests.workers import Worker, purge_broker

    purge_broker()
    process = Worker(name="main")
    yield process
    process.stop()


@pytest.fixture
def worker(_worker_process):
    """A real Celery worker process (prefork, two children), shared by the
    session's execution tests; they must use transactional databases.

    The database is flushed after each such test, so the test waits until the
    worker has finished every run it queued.
    """
    from runs.models import Run
    from tests.workers import wait_for

    yield _worker_process
    wait_for(
        lambda: not Run.objects.filter(status__in=Run.ACTIVE).exists(),
        what="queued and running runs to finish",
    )
