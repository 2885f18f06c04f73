"""Real Celery worker processes for tests that are about execution.

A worker runs `celery -A config worker` against the test database (the one
pytest-django created) and Redis database 15, in its own process group so that
a test can SIGKILL it, children and all, as a crash or a deploy would.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import redis
from django.conf import settings
from django.db import connection

ROOT = Path(__file__).resolve().parents[1]


def suite_database_url() -> str:
    params = connection.settings_dict
    user = params.get("USER") or "postgres"
    host = params.get("HOST") or "127.0.0.1"
    port = params.get("PORT") or 5432
    return f"postgres://{user}@{host}:{port}/{params['NAME']}"


def purge_broker() -> None:
    redis.Redis.from_url(settings.CELERY_BROKER_URL).flushdb()


class Worker:
    def __init__(
        self,
        *,
        pool: str = "prefork",
        concurrency: int = 2,
        env: dict[str, str] | None = None,
        name: str = "test",
    ) -> None:
        self.log_path = Path(f"/tmp/gatehouse-worker-{name}-{os.getpid()}.log")
        command = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "config",
            "worker",
            f"--pool={pool}",
            f"--concurrency={concurrency}",
            "--loglevel=INFO",
            f"--hostname={name}-{os.getpid()}@%h",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ]
        full_env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "DATABASE_URL": suite_database_url(),
            "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
            "GATEHOUSE_AGENTS": settings.GATEHOUSE_AGENTS,
            "GATEHOUSE_RUN_LEASE_SECONDS": str(settings.GATEHOUSE_RUN_LEASE_SECONDS),
            **(env or {}),
        }
        self.log = self.log_path.open("w")
        self.process = subprocess.Popen(
            command,
            cwd=ROOT,
            env=full_env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_for(
            lambda: "ready." in self.log_path.read_text() or self._died(),
            timeout=60,
            what="the worker to start",
        )
        if self._died():
            raise RuntimeError(f"worker exited:\n{self.log_path.read_text()}")

    def _died(self) -> bool:
        return self.process.poll() is not None

    def kill(self) -> None:
        """SIGKILL the worker and its children: no cleanup, no acks."""
        if not self._died():
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self) -> None:
        if not self._died():
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()
        self.log.close()

    def output(self) -> str:
        return self.log_path.read_text()


def wait_for(predicate: Callable[[], object], *, timeout: float = 30, what: str = ""):
    """Poll until predicate() is truthy; return its value or fail the test."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


@contextmanager
def doomed_worker(session_worker: Worker, **env: str) -> Iterator[Worker]:
    """Swap the session's worker for one (solo, one process) that the test
    kills inside the block; afterwards the session's worker comes back and,
    once the dead worker's lease has run out, takes its run over."""
    from runs.dispatch import runs_recover_stalled

    session_worker.stop()  # only the doomed worker may take the next run
    doomed = Worker(pool="solo", concurrency=1, name="doomed", env=env)
    try:
        yield doomed
    finally:
        doomed.kill()
        doomed.stop()
        session_worker.__init__(name="main")
    wait_for(
        lambda: runs_recover_stalled()["expired_leases"],
        timeout=60,
        what="the killed worker's lease to expire",
    )


@contextmanager
def deployed(session_worker: Worker, agents: str) -> Iterator[Worker]:
    """A deploy: the session's worker is replaced by one whose agent registry
    is `agents` (GATEHOUSE_AGENTS), and this process's registry follows."""
    from django.test import override_settings

    session_worker.stop()
    worker = Worker(name="deployed", env={"GATEHOUSE_AGENTS": agents})
    try:
        with override_settings(GATEHOUSE_AGENTS=agents):
            yield worker
    finally:
        worker.stop()
        session_worker.__init__(name="main")
