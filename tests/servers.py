"""The production web server for tests that drive Gatehouse over HTTP.

gunicorn with uvicorn workers over ASGI (config/gunicorn_conf.py,
config.asgi), as production runs it, on a free port, against the test
database and the test broker, in its own process group, with the test
settings (tests/deployment/ starts it with a production environment instead).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
from django.conf import settings

from tests.deployment.processes import free_port
from tests.workers import ROOT, suite_database_url, wait_for


class LiveServer:
    def __init__(
        self, *, workers: int = 2, env: dict[str, str] | None = None, name: str = "web"
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(f"/tmp/gatehouse-{name}-{os.getpid()}.log")
        self.log = self.log_path.open("w")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gunicorn",
                "--config",
                "config/gunicorn_conf.py",
                "--workers",
                str(workers),
                "--bind",
                f"127.0.0.1:{self.port}",
                "--graceful-timeout",
                "5",
                "config.asgi:application",
            ],
            cwd=ROOT,
            env={
                **os.environ,
                "DJANGO_SETTINGS_MODULE": "tests.settings",
                "DATABASE_URL": suite_database_url(),
                "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
                "GATEHOUSE_STREAM_URL": settings.GATEHOUSE_STREAM_URL,
                "GATEHOUSE_AGENTS": settings.GATEHOUSE_AGENTS,
                **(env or {}),
            },
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_for(
            lambda: self._answers() or self.process.poll() is not None,
            timeout=60,
            what="the web server to start",
        )
        if self.process.poll() is not None:
            raise RuntimeError(f"web server exited:\n{self.output()}")

    def _answers(self) -> bool:
        try:
            return httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        self.log.close()

    def output(self) -> str:
        return self.log_path.read_text()
