"""Gatehouse in production mode for the side-by-side benchmark, and its client.

`GatehouseStack` starts what an operator runs (see README.md, Production):
migrations, a tenant and an API key through manage.py, the web server as
docs/configuration.md says, and N Celery worker processes; on its own
Postgres database and Redis database. Beat is not started: none of its jobs
takes part in a run, and its queries would count against the run's.

`GatehouseClient` drives the refund case over REST, as an integration would.
How it learns that a run stopped or finished is the `waiter`:

- `wait` (the default): GET /api/v1/threads/{id}/runs/{run}?wait=30, the REST
  long poll, which answers the run once it has stopped (the web process waits
  on the run's Redis stream, no polling): one request;
- `poll`: GET /api/v1/threads/{id}/runs/{run} every `interval` seconds until
  the run reaches the state waited for;
- `join`: the Agent Protocol's GET /langgraph/threads/{id}/runs/{run}/join,
  which answers once the run has stopped (waiting as `wait` does), then one
  status GET to learn how it stopped.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from urllib.parse import urlencode

from peers_common import refund_request

ROOT = Path(__file__).resolve().parent.parent

# The production web server, as README.md (Production) and docs/configuration.md
# (The web server) start it; `--web-server` picks one. Each is the argv before
# --bind and --workers.
WEB_SERVERS = {
    "asgi": [
        sys.executable,
        "-m",
        "gunicorn",
        "-c",
        "config/gunicorn_conf.py",
        "config.asgi:application",
    ],
    "wsgi": [sys.executable, "-m", "gunicorn", "config.wsgi:application"],
}
TERMINAL = {"succeeded", "failed", "cancelled"}
ACTIVE = {"queued", "running"}
# The `wait` waiter's long poll, in seconds (the API's most).
WAIT_SECONDS = 30


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def process_tree_cpu(root_pid: int) -> float:
    """CPU seconds (user + system) of a process and its live descendants."""
    children: dict[int, list[int]] = defaultdict(list)
    times: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(entry.name)
        children[int(fields[1])].append(pid)
        times[pid] = (int(fields[11]) + int(fields[12])) / tick
    total, pending = 0.0, [root_pid]
    while pending:
        pid = pending.pop()
        total += times.get(pid, 0.0)
        pending.extend(children.get(pid, []))
    return total


def production_env(database_url: str, redis_url: str) -> dict[str, str]:
    """What an operator sets (docs/configuration.md), with fresh secrets."""
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DEBUG": "false",
        "DATABASE_URL": database_url,
        "CELERY_BROKER_URL": redis_url,
        # Several web processes share one throttle budget per key.
        "CACHE_URL": redis_url.replace("redis://", "rediscache://", 1),
        "SECRET_KEY": "bench-peers-" + base64.b64encode(os.urandom(24)).decode(),
        "GATEHOUSE_MASTER_KEYS": "bench:" + base64.b64encode(os.urandom(32)).decode(),
        "GATEHOUSE_AUDIT_KEYS": "bench:" + base64.b64encode(os.urandom(32)).decode(),
        # Counted and checked as in production, never in the way.
        "GATEHOUSE_THROTTLE_RATE": "1000000/minute",
        # Plain http on the loopback: production terminates TLS in a proxy in
        # front (not measured here) and would redirect this client.
        "SECURE_SSL_REDIRECT": "false",
        "ALLOWED_HOSTS": "127.0.0.1",
        "LOG_LEVEL": "WARNING",
    }


class GatehouseStack:
    """The web server and workers of one deployment (`label` names its logs)."""

    def __init__(
        self,
        *,
        env: dict[str, str],
        web_server: str,
        web_workers: int,
        log_dir: Path,
        label: str,
    ) -> None:
        self.env = env
        self.database_url = env["DATABASE_URL"]
        self.redis_url = env["CELERY_BROKER_URL"]
        self.web_server = web_server
        self.web_workers = web_workers
        self.log_dir = log_dir
        self.label = label
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.web: subprocess.Popen | None = None
        self.workers: list[subprocess.Popen] = []

    def on_database(self, database_url: str, label: str) -> GatehouseStack:
        """The same deployment (secrets, settings) on another database URL."""
        return GatehouseStack(
            env={**self.env, "DATABASE_URL": database_url},
            web_server=self.web_server,
            web_workers=self.web_workers,
            log_dir=self.log_dir,
            label=label,
        )

    # --- set-up -------------------------------------------------------------------

    def manage(self, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=self.env,
            check=True,
            capture_output=True,
            text=True,
        )
        return done.stdout

    def prepare(self) -> str:
        """Migrate, create the tenant and an API key; the key's secret."""
        import redis

        redis.Redis.from_url(self.redis_url).flushdb()
        self.manage("migrate", "--verbosity", "0")
        self.manage("create_tenant", "bench")
        return (
            self.manage(
                "create_api_key",
                "--tenant",
                "bench",
                "--scopes",
                "runs,approvals",
                "--name",
                "bench",
            )
            .strip()
            .splitlines()[-1]
        )

    def _spawn(self, argv: list[str], log_name: str) -> subprocess.Popen:
        log = open(self.log_dir / log_name, "a")
        return subprocess.Popen(
            argv, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT
        )

    def start_web(self) -> None:
        self.web = self._spawn(
            [
                *WEB_SERVERS[self.web_server],
                "--bind",
                f"127.0.0.1:{self.port}",
                "--workers",
                str(self.web_workers),
            ],
            f"gatehouse-{self.label}-web.log",
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                if self.web.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the web server did not start: see {self.log_dir}"
                    ) from None
                time.sleep(0.2)

    def start_workers(self, count: int) -> None:
        """`count` worker processes of 2 pool processes each, as deployed."""
        self.stop_workers()
        for index in range(count):
            self.workers.append(
                self._spawn(
                    [
                        sys.executable,
                        "-m",
                        "celery",
                        "-A",
                        "config",
                        "worker",
                        "--concurrency=2",
                        # The README's production worker command's flags.
                        "--without-gossip",
                        "--without-mingle",
                        "--without-heartbeat",
                        "--loglevel=WARNING",
                        f"--hostname=peers{index}@%h",
                    ],
                    f"gatehouse-{self.label}-worker-{index}.log",
                )
            )
        self._wait_for_workers(count)

    def _wait_for_workers(self, count: int) -> None:
        """Until every worker answers a ping: connected and consuming."""
        from celery import Celery

        probe = Celery(broker=self.redis_url)
        deadline = time.monotonic() + 90
        while len(probe.control.ping(timeout=1.0)) < count:
            if time.monotonic() > deadline or any(
                worker.poll() is not None for worker in self.workers
            ):
                raise RuntimeError(f"workers did not start: see {self.log_dir}")
        probe.close()

    def stop_workers(self) -> None:
        for worker in self.workers:
            worker.send_signal(signal.SIGTERM)
        for worker in self.workers:
            try:
                worker.wait(timeout=60)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
        self.workers = []

    def stop(self) -> None:
        self.stop_workers()
        if self.web is not None:
            self.web.send_signal(signal.SIGTERM)
            self.web.wait(timeout=60)
            self.web = None

    # --- what the processes cost ----------------------------------------------------

    def cpu_seconds(self) -> dict[str, float]:
        return {
            "web": process_tree_cpu(self.web.pid) if self.web else 0.0,
            "workers": sum(process_tree_cpu(w.pid) for w in self.workers),
        }


_ENDPOINTS = [
    (r"POST /api/v1/threads$", "create thread"),
    (r"POST /api/v1/threads/[^/]+/runs$", "start run"),
    (r"GET /api/v1/threads/[^/]+/runs/[^/?]+\?wait=", "wait run"),
    (r"GET /api/v1/threads/[^/]+/runs/[^/?]+$", "poll run"),
    (r"GET /api/v1/approvals$", "find approval"),
    (r"POST /api/v1/approvals/[^/]+/decision$", "decision"),
    (r"GET /langgraph/threads/[^/]+/runs/[^/]+/join$", "join run"),
]


def endpoint_name(method: str, path: str) -> str:
    """A request's name in the report; its query only tells a wait apart."""
    request = f"{method} {path}"
    bare = request.split("?", 1)[0]
    for pattern, name in _ENDPOINTS:
        if re.match(pattern, request) or re.match(pattern, bare):
            return name
    return bare


class ApiError(RuntimeError):
    pass


class GatehouseClient:
    """The refund case over REST; one keep-alive connection per client thread.

    `timings` collects each request's time as the client saw it, by endpoint
    (`endpoint_name`), for the report's breakdown of the web tier.
    """

    def __init__(
        self, base_url: str, api_key: str, *, waiter: str, interval: float
    ) -> None:
        self.host, self.port = base_url.removeprefix("http://").split(":")
        self.headers = {
            "Authorization": f"Bearer {api_key}",
            "Content-Type": "application/json",
        }
        self.waiter = waiter
        self.interval = interval
        self.local = threading.local()
        self.timings: dict[str, list[float]] = defaultdict(list)

    def request(self, method: str, path: str, body: dict | None = None) -> dict:
        for attempt in (1, 2):
            connection = getattr(self.local, "connection", None)
            if connection is None:
                connection = http.client.HTTPConnection(
                    self.host, int(self.port), timeout=120
                )
                self.local.connection = connection
            try:
                started = time.perf_counter()
                connection.request(
                    method,
                    path,
                    body=None if body is None else json.dumps(body),
                    headers=self.headers,
                )
                response = connection.getresponse()
                payload = response.read()
                self.timings[endpoint_name(method, path)].append(
                    time.perf_counter() - started
                )
            except (ConnectionError, http.client.HTTPException):
                # The server closed an idle keep-alive connection: reconnect once.
                connection.close()
                self.local.connection = None
                if attempt == 2:
                    raise
                continue
            if response.status >= 300:
                raise ApiError(f"{method} {path}: {response.status} {payload[:300]!r}")
            return json.loads(payload) if payload else {}
        raise AssertionError("unreachable")

    def timing_mark(self) -> dict[str, int]:
        return {name: len(times) for name, times in self.timings.items()}

    def timings_since(self, mark: dict[str, int]) -> dict[str, list[float]]:
        return {
            name: times[mark.get(name, 0) :]
            for name, times in self.timings.items()
            if len(times) > mark.get(name, 0)
        }

    def _until(
        self, thread_id: str, run_id: str, wanted: str, marks: dict, prefix: str
    ) -> tuple[dict, int]:
        """Wait for the run to reach `wanted`; the run's last view and the calls.

        With `join`, the wall-clock time the join answered goes into `marks`
        as `<prefix> joined` (bench/peers_anatomy.py).
        """
        path = f"/api/v1/threads/{thread_id}/runs/{run_id}"
        calls = 0
        if self.waiter == "join":
            self.request("GET", f"/langgraph/threads/{thread_id}/runs/{run_id}/join")
            marks[f"{prefix} joined"] = time.time()
            calls += 1
        if self.waiter == "wait":
            path += f"?wait={WAIT_SECONDS}"
        while True:
            run = self.request("GET", path)
            calls += 1
            if run["status"] == wanted:
                return run, calls
            stopped = run["status"] not in ACTIVE
            if (
                run["status"] in TERMINAL
                or self.waiter == "join"
                or (self.waiter == "wait" and stopped)
            ):
                raise ApiError(f"run {run_id} is {run['status']}, not {wanted}")
            if self.waiter == "poll":
                time.sleep(self.interval)

    def flow(self, case: int) -> dict:
        """One refund case; durations (perf_counter) and, in `marks`, the
        wall-clock times (time.time(): the server's clock on this machine)
        at which the client sent or learnt something (bench/peers_anatomy.py)."""
        thread_id = f"peers-{case}"
        self.request(
            "POST", "/api/v1/threads", {"thread_id": thread_id, "agent": "refund"}
        )
        marks: dict[str, float] = {}
        started = time.perf_counter()
        marks["start sent"] = time.time()
        run_id = self.request(
            "POST",
            f"/api/v1/threads/{thread_id}/runs",
            {"input": refund_request(case)},
        )["run_id"]
        marks["start answered"] = time.time()
        first, calls_first = self._until(
            thread_id, run_id, "interrupted", marks, "start"
        )
        waiting = time.perf_counter()
        marks["waiting known"] = time.time()
        query = urlencode({"thread_id": thread_id, "status": "pending"})
        approval_id = self.request("GET", f"/api/v1/approvals?{query}")["results"][0][
            "id"
        ]
        decided = time.perf_counter()
        marks["decision sent"] = time.time()
        resumed_id = self.request(
            "POST",
            f"/api/v1/approvals/{approval_id}/decision",
            {"approved": True, "reviewer": "bench"},
        )["resumed_run"]["run_id"]
        sent = time.perf_counter()
        marks["decision answered"] = time.time()
        second, calls_second = self._until(
            thread_id, resumed_id, "succeeded", marks, "resume"
        )
        done = time.perf_counter()
        marks["succeeded known"] = time.time()
        return {
            "start_to_waiting": waiting - started,
            "decision_call": sent - decided,
            "decision_to_succeeded": done - decided,
            "status_calls": calls_first + calls_second,
            "requests": 4 + calls_first + calls_second,
            "runs": [run_times(first), run_times(second)],
            "thread_id": thread_id,
            "run_id": resumed_id,
            "marks": marks,
        }


def run_times(run: dict) -> dict:
    """Seconds a run waited to be claimed and then executed, from its timestamps."""
    created, started, ended = (
        datetime.fromisoformat(run[name].replace("Z", "+00:00"))
        for name in ("created_at", "started_at", "ended_at")
    )
    return {
        "queued": (started - created).total_seconds(),
        "executing": (ended - started).total_seconds(),
    }
