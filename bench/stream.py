"""The Agent Protocol over the official langgraph-sdk: how soon a run's end
reaches the client, and how many complete flows the platform carries.

Production mode: Postgres, Redis (broker and stream events), gunicorn with
uvicorn workers (config.asgi) and two Celery worker processes. The agent asks
the user a question (an input interrupt) and ends once resumed: one step
before the interrupt, one after, so the figures are the platform's, not an
agent's. Measured, each on a fresh thread, one at a time:

- start -> interrupted through `runs.wait`;
- resume -> finished (a `command={"resume": ...}`), through `runs.wait`,
  through `runs.create` + `runs.join`, and through `runs.stream` (to its
  `end` event), taking turns so that a busy moment falls on all three;
- first-event latency of `runs.stream` (the request sent -> its first event);

then complete flows (create a thread, `runs.wait` to the interrupt,
`runs.wait` with the resume) with `--concurrency` clients at once.

    python bench/stream.py [--samples 90] [--flows 200] [--concurrency 20]

Uses its own database (gatehouse_bench_stream, recreated; another name with
GATEHOUSE_BENCH_STREAM_DB) and Redis database
`--redis-db` (12, flushed). Writes its section of docs/benchmarks.md (`--no-write`).
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

# Several people may benchmark on one machine: each names their own database.
DB_NAME = os.environ.get("GATEHOUSE_BENCH_STREAM_DB", "gatehouse_bench_stream")
PG = "postgres://postgres@127.0.0.1:5432"
AGENT = "ask"
TITLE = "Agent Protocol: waiting and streaming"
NOTE = """Reading these figures: the load average at the start says how far from
idle the machine was (2 cores); the one at the end includes the benchmark's own
concurrency phase, which keeps both cores busy. Under load a figure here is
mostly the time spent waiting for a core. What a resume
costs, in order: the web process's request (the thread's row lock, the run
row, a `run.queued` audit event, one commit), the Celery hand-off through
Redis, the worker's claim (locks, lease, `run.started`, one commit), the step
and its checkpoint, the finish (`run.succeeded`, one commit), the `end` event
through Redis to the waiting web process (which wakes on it, no polling), and
the `run.output_read` audit event of the reader. Every audit event of a tenant
takes that tenant's sequence row until its transaction commits (the trail's
gap-free order), so the flows of one tenant, as here, queue on it: in the
concurrency phase about 0.5 transactions wait on it on average, 2-3 with
twice the worker processes (docs/scaling.md). The web processes hold no
thread while they wait: a waiting call is a blocked XREAD in the event loop."""


def configure(redis_db: int) -> None:
    os.environ.update(
        {
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "DATABASE_URL": f"{PG}/{DB_NAME}",
            "CELERY_BROKER_URL": f"redis://127.0.0.1:6379/{redis_db}",
            "GATEHOUSE_STREAM_URL": f"redis://127.0.0.1:6379/{redis_db}",
            "SECRET_KEY": "bench",
            "DEBUG": "false",
            "GATEHOUSE_MASTER_KEYS": "bench:"
            + "QkVOQ0hNQVJLLUtFWS0zMi1CWVRFUy1MT05HLi4uLi4=",
            "GATEHOUSE_AUDIT_KEYS": "bench-audit:"
            + "QkVOQ0hNQVJLLUFVRElULUtFWS0zMi1CWVRFUy0uLiE=",
            # The SDK speaks plain http to 127.0.0.1; production would redirect.
            "SECURE_SSL_REDIRECT": "false",
            "GATEHOUSE_THROTTLE_RATE": "10000000/minute",
            "ALLOWED_HOSTS": "127.0.0.1",
            "GATEHOUSE_AGENTS": f"{AGENT}@1=tests.agents:question_graph",
        }
    )


def recreate_database() -> None:
    """Drops (with its sessions) and creates DB_NAME: only a benchmark's
    database, so a mistaken GATEHOUSE_BENCH_STREAM_DB (say, the real
    database's name) is refused, not dropped."""
    import psycopg
    from psycopg import sql

    if "bench" not in DB_NAME:
        sys.exit(
            f"GATEHOUSE_BENCH_STREAM_DB={DB_NAME!r}: the database is dropped and "
            "created again, so its name must contain 'bench'"
        )
    name = sql.Identifier(DB_NAME)
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(name))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(command: list[str], name: str) -> subprocess.Popen:
    log = open(f"/tmp/gatehouse-bench-stream-{name}.log", "w")  # noqa: SIM115
    return subprocess.Popen(
        command,
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=os.environ.copy(),
        start_new_session=True,
    )


def start_platform(
    web_workers: int, run_workers: int, worker_concurrency: int = 1
) -> tuple[str, list]:
    port = free_port()
    processes = [
        start(
            [
                sys.executable,
                "-m",
                "gunicorn",
                "config.asgi:application",
                "--worker-class",
                "uvicorn_worker.UvicornWorker",
                "--workers",
                str(web_workers),
                "--bind",
                f"127.0.0.1:{port}",
                # Longer than any pause of a client: a connection closed for
                # idleness while a client reuses it would be reset.
                "--keep-alive",
                "75",
            ],
            "web",
        )
    ]
    for index in range(run_workers):
        processes.append(
            start(
                [
                    *(sys.executable, "-m", "celery", "-A", "config", "worker"),
                    "--pool=prefork",
                    f"--concurrency={worker_concurrency}",
                    "--loglevel=WARNING",
                    f"--hostname=benchstream{index}@%h",
                    "--without-gossip",
                    "--without-mingle",
                    "--without-heartbeat",
                ],
                f"worker{index}",
            )
        )
    url = f"http://127.0.0.1:{port}"
    wait_until_up([url])
    return url, processes


def wait_until_up(urls: list[str]) -> None:
    """Until each web server answers /healthz (a minute at most), then the
    time the workers take to connect to the broker."""
    import httpx

    deadline = time.monotonic() + 60
    for url in urls:
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the web server at {url} did not start")
            time.sleep(0.2)
    time.sleep(5)


def stop(processes) -> None:
    for process in processes:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)


def api_key(scopes: list[str] | None = None) -> str:
    import django

    django.setup()
    from django.core.management import call_command

    from audit.services import Actor
    from runs import services

    call_command("migrate", verbosity=0)
    tenant = services.tenant_create(
        slug="bench", name="Bench", actor=Actor.system("bench")
    )
    return services.api_key_create(
        tenant=tenant,
        name="bench",
        scopes=scopes or ["runs"],
        actor=Actor.system("bench"),
    ).secret


def client_for(url: str, key: str):
    from langgraph_sdk import get_sync_client

    return get_sync_client(url=f"{url}/langgraph", api_key=key)


def interrupted_thread(client) -> tuple[str, float]:
    thread_id = client.threads.create(metadata={"graph_id": AGENT})["thread_id"]
    started = time.perf_counter()
    output = client.runs.wait(thread_id, AGENT, input={})
    elapsed = time.perf_counter() - started
    assert output["__interrupt__"], output
    return thread_id, elapsed


RESUME = {"resume": "order A-1"}


def resume_wait(client, thread_id) -> float:
    started = time.perf_counter()
    output = client.runs.wait(thread_id, AGENT, command=RESUME)
    elapsed = time.perf_counter() - started
    assert output == {"answer": "order A-1"}, output
    return elapsed


def resume_join(client, thread_id) -> float:
    started = time.perf_counter()
    run = client.runs.create(thread_id, AGENT, command=RESUME)
    output = client.runs.join(thread_id, run["run_id"])
    elapsed = time.perf_counter() - started
    assert output == {"answer": "order A-1"}, output
    return elapsed


def resume_stream(client, thread_id) -> tuple[float, float]:
    started = time.perf_counter()
    first = None
    events = []
    for part in client.runs.stream(
        thread_id, AGENT, command=RESUME, stream_mode="values"
    ):
        first = first if first is not None else time.perf_counter() - started
        events.append(part.event)
    elapsed = time.perf_counter() - started
    assert events[0] == "metadata" and events[-1] == "end", events
    return elapsed, first


def flow(client) -> float:
    started = time.perf_counter()
    thread_id, _ = interrupted_thread(client)
    resume_wait(client, thread_id)
    return time.perf_counter() - started


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


def row(name: str, values: list[float]) -> str:
    return (
        f"| {name} | {len(values)} | {ms(statistics.median(values))} | "
        f"{ms(percentile(values, 0.95))} | {ms(max(values))} |"
    )


def load() -> str:
    return ", ".join(f"{value:.1f}" for value in os.getloadavg())


def cpu_seconds(processes: list) -> dict[str, float]:
    """CPU seconds so far of each tier: the web server and the workers (their
    process trees), Postgres (the backends connected to the benchmark's
    database) and this client."""
    import resource

    import psycopg
    from peers_gatehouse import process_tree_cpu

    with psycopg.connect(f"{PG}/{DB_NAME}") as conn:
        backends = [
            pid
            for (pid,) in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid()"
            )
        ]
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "web": process_tree_cpu(processes[0].pid),
        "workers": sum(process_tree_cpu(p.pid) for p in processes[1:]),
        # Backends live as long as their connections (pools, persistent
        # ones): one that closed in the phase is missed.
        "postgres": {pid: process_tree_cpu(pid) for pid in backends},
        "client": usage.ru_utime + usage.ru_stime,
    }


def cpu_per_flow(before: dict, after: dict, flows: int) -> dict[str, float]:
    postgres = sum(
        seconds - before["postgres"].get(pid, 0.0)
        for pid, seconds in after["postgres"].items()
    )
    return {
        tier: (postgres if tier == "postgres" else after[tier] - before[tier])
        / max(flows, 1)
        for tier in after
    }


def claim_and_execution(since: float) -> tuple[float, float]:
    """Mean seconds the runs created since `since` (epoch) waited to be
    claimed (started_at - created_at), and executed (ended_at - started_at)."""
    import psycopg

    with psycopg.connect(f"{PG}/{DB_NAME}") as conn:
        return conn.execute(
            "SELECT avg(extract(epoch FROM started_at - created_at)),"
            " avg(extract(epoch FROM ended_at - started_at)) FROM runs_run"
            " WHERE created_at >= to_timestamp(%s) AND ended_at IS NOT NULL",
            [since],
        ).fetchone()


def measure(
    url: str, key: str, samples: int, flows: int, concurrency: int, processes: list
) -> dict:
    # django.setup() left httpx logging each request: hundreds of lines.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    client = client_for(url, key)
    for _ in range(5):  # warm every process up
        thread_id, _ = interrupted_thread(client)
        resume_wait(client, thread_id)
    results = {"start": [], "wait": [], "join": [], "stream": [], "first": []}
    ways = itertools.cycle(["wait", "join", "stream"])
    for _ in range(samples):
        thread_id, elapsed = interrupted_thread(client)
        results["start"].append(elapsed)
        way = next(ways)
        if way == "wait":
            results["wait"].append(resume_wait(client, thread_id))
        elif way == "join":
            results["join"].append(resume_join(client, thread_id))
        else:
            total, first = resume_stream(client, thread_id)
            results["stream"].append(total)
            results["first"].append(first)
    local = threading.local()

    def one_flow(_) -> float | None:
        if not hasattr(local, "client"):
            local.client = client_for(url, key)  # one client per thread
        try:
            return flow(local.client)
        except Exception as failure:  # noqa: BLE001  counted, and said
            print(f"flow failed: {failure!r}", file=sys.stderr)
            return None

    cpu_before, since = cpu_seconds(processes), time.time()
    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        outcomes = list(pool.map(one_flow, range(flows)))
    results["wall"] = time.perf_counter() - started
    results["flows"] = [latency for latency in outcomes if latency is not None]
    results["failed"] = outcomes.count(None)
    results["cpu"] = cpu_per_flow(
        cpu_before, cpu_seconds(processes), len(results["flows"])
    )
    results["claim"], results["execution"] = claim_and_execution(since)
    return results


def section(results: dict, args) -> str:
    from importlib.metadata import version

    rate = len(results["flows"]) / results["wall"]
    resume_p50 = {
        way: statistics.median(results[way]) for way in ("wait", "join", "stream")
    }
    met = all(value < 0.100 for value in resume_p50.values())
    lines = [
        f"## {TITLE} (`bench/stream.py`)",
        "",
        f"`make bench-stream`, run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
        "",
        f"- Machine: {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, langgraph {version('langgraph')}, "
        f"langgraph-sdk {version('langgraph-sdk')}; PostgreSQL and Redis on the "
        f"same machine; load average {results['load_start']} at the start, "
        f"{load()} at the end (the benchmark's own processes included).",
        f"- Platform: gunicorn with {args.web_workers} uvicorn workers, "
        f"{args.run_workers} Celery worker processes (prefork, concurrency "
        f"{args.worker_concurrency}), "
        "stream events in Redis.",
        "- Agent: one step to an input interrupt, one step once resumed "
        "(`tests.agents:question_graph`). Every call through the official "
        "langgraph-sdk (sync client), timed in the client.",
        "",
        "| measure | samples | p50 | p95 | max |",
        "|---|---:|---:|---:|---:|",
        row("start → interrupted, `runs.wait`", results["start"]),
        row("resume → finished, `runs.wait`", results["wait"]),
        row("resume → finished, `runs.create` + `runs.join`", results["join"]),
        row("resume → finished, `runs.stream` to `end`", results["stream"]),
        row("`runs.stream`: first event", results["first"]),
        row(
            f"complete flow at concurrency {args.concurrency}",
            results["flows"],
        ),
        "",
        f"Complete flows (thread, start → interrupted, resume → finished) at "
        f"concurrency {args.concurrency}: **{rate:.1f} flows/s** "
        f"({len(results['flows'])} in {results['wall']:.1f} s; "
        f"{results['failed']} failed). CPU per complete flow in that phase: "
        + ", ".join(f"{tier} {ms(value)}" for tier, value in results["cpu"].items())
        + " (Postgres: the backends of the benchmark's database; the client: "
        f"this benchmark); runs waited {ms(results['claim'])} on average to be "
        f"claimed by a worker and executed for {ms(results['execution'])}.",
        "",
        "Targets (on an idle machine):",
        "",
        f"- {'met' if met else 'MISSED'}: resume → finished under 100 ms at p50 "
        "through each of `runs.wait`, `runs.join` and `runs.stream` ("
        + ", ".join(f"{way} {ms(value)}" for way, value in resume_p50.items())
        + ").",
        f"- {'met' if rate >= 15 else 'MISSED'}: at least 15 complete flows/s at "
        f"concurrency {args.concurrency} ({rate:.1f}).",
        "",
        NOTE,
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=90)
    parser.add_argument("--flows", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=20)
    parser.add_argument("--web-workers", type=int, default=2)
    parser.add_argument("--run-workers", type=int, default=2)
    # Pool processes per worker. Two (Celery's default here, one per core)
    # shortened the runs' wait for a worker (claim delay 380 -> 310 ms at
    # concurrency 20) but doubled their execution (45 -> 85 ms): the tenant's
    # audit sequence row had 2-3 transactions waiting on it on average instead
    # of 0.5 (docs/scaling.md). 12.2 flows/s either way, so one, as before.
    parser.add_argument("--worker-concurrency", type=int, default=1)
    parser.add_argument("--redis-db", type=int, default=12)
    parser.add_argument(
        "--no-write", action="store_true", help="print, leave docs/benchmarks.md"
    )
    args = parser.parse_args()
    load_start = load()  # before the platform starts: how idle the machine was
    configure(args.redis_db)
    recreate_database()
    import redis

    redis.Redis.from_url(os.environ["CELERY_BROKER_URL"]).flushdb()
    key = api_key()
    url, processes = start_platform(
        args.web_workers, args.run_workers, args.worker_concurrency
    )
    try:
        results = measure(
            url, key, args.samples, args.flows, args.concurrency, processes
        )
        results["load_start"] = load_start
    finally:
        stop(processes)
    body = section(results, args)
    print(body)
    if not args.no_write:
        from benchmarks_doc import write_section

        write_section(TITLE, body)


if __name__ == "__main__":
    main()
