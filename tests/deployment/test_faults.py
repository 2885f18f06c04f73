"""Acceptance 3 of issue 16: the production stack through a Postgres restart
and then a Redis restart, with runs in flight and requests arriving.

Gunicorn (uvicorn workers), two Celery workers and beat run as an operator
starts them (config.settings, the production environment), against a
Postgres and a Redis that this test starts on ports of its own, so that it
can restart them: the shared services are never touched. Afterwards every
run has finished, no process has died, no request was answered 500, and
every request that was accepted replays its first answer when it is retried
with its Idempotency-Key.
"""

from __future__ import annotations

import http.client
import json
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import psycopg
import pytest
import redis

from tests.deployment.processes import (
    PYTHON,
    ROOT,
    free_port,
    gunicorn_command,
    manage,
    production_env,
)
from tests.workers import wait_for

pytestmark = pytest.mark.server
POSTGRES_BIN = Path("/usr/lib/postgresql/15/bin")
HTTPS = {"X-Forwarded-Proto": "https", "Content-Type": "application/json"}
LONG_RUNS = 8


class OwnPostgres:
    """A throwaway cluster, run as the postgres user, on its own port."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="gh-faults-pg-"))
        shutil.chown(self.folder, "postgres", "postgres")
        self.data = self.folder / "data"
        self.port = free_port()
        self._as_postgres(
            POSTGRES_BIN / "initdb",
            "-D",
            self.data,
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
        )
        self.start()

    def _as_postgres(self, *command) -> None:
        subprocess.run(
            ["runuser", "-u", "postgres", "--", *map(str, command)],
            check=True,
            capture_output=True,
            timeout=120,
        )

    def start(self) -> None:
        options = (
            f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1"
            " -c fsync=off -c max_connections=200"
        )
        self._as_postgres(
            POSTGRES_BIN / "pg_ctl",
            "-D",
            self.data,
            "-l",
            self.folder / "log",
            "-o",
            options,
            "-w",
            "start",
        )

    def stop(self) -> None:
        self._as_postgres(
            POSTGRES_BIN / "pg_ctl", "-D", self.data, "-m", "fast", "-w", "stop"
        )

    def url(self, database: str) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{database}"

    def remove(self) -> None:
        try:
            self.stop()
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)


class OwnRedis:
    """A redis-server that keeps nothing on disk: a restart loses the queue."""

    def __init__(self) -> None:
        self.port = free_port()
        self.process = None
        self.start()

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for(self._answers, timeout=30, what="redis-server to start")

    def _answers(self) -> bool:
        try:
            return redis.Redis(port=self.port).ping()
        except redis.ConnectionError:
            return False

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


class Process:
    def __init__(self, name: str, command: list[str], env: dict, folder: Path) -> None:
        self.name = name
        self.log_path = folder / f"{name}.log"
        with self.log_path.open("w") as log:
            self.popen = subprocess.Popen(
                command,
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log(self) -> str:
        return self.log_path.read_text()

    def stop(self) -> None:
        if self.alive():
            self.popen.terminate()
            try:
                self.popen.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.popen.kill()


class Client:
    """Requests as a client makes them; every answer kept."""

    def __init__(self, port: int, secret: str) -> None:
        self.port = port
        self.headers = {**HTTPS, "Authorization": f"Bearer {secret}"}
        self.answers: list[dict] = []

    def send(self, method: str, path: str, body=None, key: str | None = None) -> dict:
        headers = dict(self.headers)
        if key:
            headers["Idempotency-Key"] = key
        answer = {"method": method, "path": path, "body": body, "key": key}
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            connection.request(
                method,
                path,
                body=None if body is None else json.dumps(body),
                headers=headers,
            )
            response = connection.getresponse()
            raw = response.read()
            answer.update(
                status=response.status,
                # Case-insensitive, as HTTP names are: uvicorn's httptools
                # protocol sends them in lower case.
                headers=response.headers,
                json=json.loads(raw) if raw.startswith((b"{", b"[")) else raw,
            )
        except OSError as error:  # no answer at all: the server is gone
            answer.update(status=0, headers={}, json=repr(error))
        finally:
            connection.close()
        self.answers.append(answer)
        return answer


def _traffic(client: Client, stop: threading.Event) -> None:
    """A client that keeps creating threads and runs, with keys, and reading."""
    number = 0
    while not stop.is_set():
        number += 1
        thread_id = f"traffic-{number}"
        client.send(
            "POST",
            "/api/v1/threads",
            {"thread_id": thread_id, "agent": "echo"},
            key=f"t-{number}",
        )
        client.send(
            "POST",
            f"/api/v1/threads/{thread_id}/runs",
            {"input": {"text": "hi"}},
            key=f"r-{number}",
        )
        client.send("GET", "/api/v1/threads?limit=5")
        stop.wait(0.3)


@pytest.fixture
def stack(tmp_path):
    folder = tmp_path  # the processes' logs, kept by pytest for a failure
    postgres, redis_server = OwnPostgres(), OwnRedis()
    processes: list[Process] = []
    try:
        with psycopg.connect(postgres.url("postgres"), autocommit=True) as admin:
            admin.execute("CREATE DATABASE gatehouse")
        env = production_env(
            DATABASE_URL=postgres.url("gatehouse"),
            CELERY_BROKER_URL=f"redis://127.0.0.1:{redis_server.port}/0",
            GATEHOUSE_AGENTS="long@1=tests.agents:long_graph,echo@1=tests.agents:echo_graph",
            GATEHOUSE_RUN_LEASE_SECONDS="6",
            GATEHOUSE_RECOVERY_SWEEP_SECONDS="2",
            DATABASE_POOL_TIMEOUT="3",
            # The test's one key makes every request: the traffic, the status
            # polls until every run finished and the replays of each write.
            # On a fast machine they pass the default 600 a minute, and a
            # replay answered 429 before its stored answer was read.
            GATEHOUSE_THROTTLE_RATE="100000/minute",
        )
        for command in (
            ["migrate", "--noinput"],
            ["create_tenant", "acme"],
        ):
            done = manage(*command, env=env)
            assert done.returncode == 0, done.stderr
        issued = manage(
            "create_api_key", "--tenant", "acme", "--scopes", "runs", env=env
        )
        assert issued.returncode == 0, issued.stderr
        secret = issued.stdout.strip().splitlines()[-1]
        port = free_port()
        celery = [PYTHON, "-m", "celery", "-A", "config"]
        processes += [
            Process(
                "web",
                gunicorn_command(port),
                env,
                folder,
            ),
            *(
                Process(
                    f"worker{n}",
                    [
                        *celery,
                        "worker",
                        "--concurrency=2",
                        "--loglevel=INFO",
                        f"--hostname=w{n}@%h",
                        # The README's production worker command's flags.
                        "--without-gossip",
                        "--without-mingle",
                        "--without-heartbeat",
                    ],
                    env,
                    folder,
                )
                for n in (1, 2)
            ),
            Process("beat", [*celery, "beat", "--loglevel=INFO"], env, folder),
        ]
        client = Client(port, secret)
        wait_for(
            lambda: _healthy(port) or not all(p.alive() for p in processes),
            timeout=60,
            what="gunicorn to answer",
        )
        wait_for(
            lambda: (
                all(
                    "ready." in p.log()
                    for p in processes
                    if p.name.startswith("worker")
                )
                or not all(p.alive() for p in processes)
            ),
            timeout=60,
            what="the workers to start",
        )
        assert all(p.alive() for p in processes), {
            p.name: p.log()[-2000:] for p in processes
        }
        yield postgres, redis_server, processes, client
    finally:
        for process in processes:
            process.stop()
        redis_server.stop()
        postgres.remove()


def _healthy(port: int) -> bool:
    try:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        connection.request("GET", "/healthz")
        return connection.getresponse().status == 200
    except OSError:
        return False


def test_the_stack_carries_on_through_a_postgres_and_a_redis_restart(stack):
    postgres, redis_server, processes, client = stack
    runs = []
    for number in range(LONG_RUNS):
        thread_id = f"long-{number}"
        created = client.send(
            "POST", "/api/v1/threads", {"thread_id": thread_id, "agent": "long"}
        )
        assert created["status"] == 201, created
        started = client.send(
            "POST",
            f"/api/v1/threads/{thread_id}/runs",
            {"input": {}},
            key=f"long-{number}",
        )
        assert started["status"] == 202, started
        runs.append((thread_id, started["json"]["run_id"]))

    def status_of(thread_id, run_id) -> str:
        answer = client.send("GET", f"/api/v1/threads/{thread_id}/runs/{run_id}")
        return answer["json"].get("status") if answer["status"] == 200 else ""

    wait_for(
        lambda: sum(status_of(*run) == "running" for run in runs) >= 4,
        timeout=30,
        what="runs to be in flight",
    )
    stop = threading.Event()
    traffic = threading.Thread(target=_traffic, args=(client, stop))
    traffic.start()
    try:
        time.sleep(1)
        postgres.stop()
        time.sleep(4)
        postgres.start()
        time.sleep(4)
        redis_server.stop()
        time.sleep(4)
        redis_server.start()
        time.sleep(3)
    finally:
        stop.set()
        traffic.join(timeout=120)

    # Every run finishes: the in-flight ones and every one the traffic started.
    accepted_runs = [
        (a["path"].split("/")[4], a["json"]["run_id"])
        for a in client.answers
        if a["method"] == "POST" and a["path"].endswith("/runs") and a["status"] == 202
    ]
    pending = set(runs) | set(accepted_runs)

    def all_finished() -> bool:
        for run in list(pending):
            if status_of(*run) == "succeeded":
                pending.discard(run)
        return not pending

    wait_for(
        all_finished, timeout=90, what=f"every run to succeed ({len(pending)} left)"
    )
    dead = [p.name for p in processes if not p.alive()]
    assert not dead, {p.name: p.log()[-3000:] for p in processes if p.name in dead}
    statuses = sorted({a["status"] for a in client.answers})
    assert 0 not in statuses  # every request was answered
    assert 503 in statuses  # the clients did meet the outage
    assert 500 not in statuses and all(s < 500 or s == 503 for s in statuses), statuses
    for answer in client.answers:
        if answer["status"] == 503:
            assert answer["headers"].get("Retry-After"), answer
            assert answer["json"]["code"] == "service_unavailable", answer
    # Every accepted write, retried with its key, replays its first answer.
    accepted = [a for a in client.answers if a["key"] and 200 <= a["status"] < 300]
    assert len(accepted) > LONG_RUNS
    for answer in accepted:
        again = client.send(
            answer["method"], answer["path"], answer["body"], key=answer["key"]
        )
        assert (again["status"], again["json"]) == (answer["status"], answer["json"]), (
            answer
        )
        assert again["headers"].get("Idempotent-Replayed") == "true"
    beat = next(p for p in processes if p.name == "beat")
    assert "beat raised exception" not in beat.log()
