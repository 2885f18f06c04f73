"""Side by side: Gatehouse, DBOS Transact and plain LangGraph on one refund case.

    make bench-peers                      # the full run (about 40 minutes on a busy machine)
    make bench-peers ARGS=--quick         # a short run (about 12 minutes)
    python bench/peers.py --help

The case (bench/peers_common.py): plan a refund, wait for a human decision,
pay, notify. Three engines run it, each on its own database of the Postgres
server DATABASE_URL names (`<name>_peers_gatehouse`, `_dbos`, `_floor`,
recreated here):

- Gatehouse in production mode over REST (bench/peers_gatehouse.py): the web
  server as docs/configuration.md says, Celery workers on Redis (db 13,
  flushed; or --redis-url), the demo `refund` agent;
- DBOS Transact 3.4 (bench/peers_engine.py), the same shape as a workflow
  with `recv`, in its own process;
- plain LangGraph with PostgresSaver, the floor, in its own process.

Phases:

1. What a complete run asks of Postgres: each engine in turn is started on a
   counting proxy of the Postgres protocol (bench/peers_pgcount.py) and runs
   a batch of cases one after another: rows inserted and updated (by table),
   transactions, round trips. The engine's idle background (DBOS's pollers)
   is measured and subtracted; the Gatehouse client checks status every
   0.5 s there, and what one status check costs is measured apart.
2. Latency: rounds in which each engine (in turn, order rotating) runs a few
   cases one after another, so that whatever else loads the machine falls on
   all of them alike; p50 and p95 over all rounds. Gatehouse's two latencies
   are also broken into phases, from the timestamps its runs, audit events,
   checkpoints and tool calls record and the client's clock
   (bench/peers_anatomy.py).
3. Throughput: complete runs per second, N runs with C in flight, for 1, 2
   and 4 worker processes (Gatehouse: Celery workers of 2 pool processes
   each; DBOS: application processes, each running its share of the cases;
   the floor: one process only).

The table and the details are printed and written to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from benchmarks_doc import cpu_model, load_average, write_section  # noqa: E402
from peers_anatomy import anatomy  # noqa: E402
from peers_common import (  # noqa: E402
    MEASURES,
    latency_samples,
    percentile,
    throughput,
)
from peers_gatehouse import (  # noqa: E402
    WEB_SERVERS,
    GatehouseClient,
    GatehouseStack,
    production_env,
)
from peers_pgcount import CountingProxy, Tally, proxied_url  # noqa: E402
from peers_report import ENGINES, report  # noqa: E402

DEFAULT_SERVER = "postgres://postgres@127.0.0.1:5432/gatehouse"
# What the counting proxy tallies, per complete run.
COUNTED = ("transactions", "write_transactions", "round_trips", "statements")
# Seconds of doing nothing over which an engine's background is measured.
IDLE_SECONDS = 5.0
# After the client's last answer, what the engine still sends (a worker's
# last statements after the run's outcome is committed, say) has this long.
STRAGGLER_SECONDS = 1.0
STATUS_CALLS = 50
WARM_UP_RUNS = 3
# The client's status checks while counting: rare, so that the count is
# mostly the run's own work; what one costs is measured apart.
COUNT_POLL_INTERVAL = 0.5
# What polling costs under load: the first throughput figure again, the
# client polling this much less often.
SLOW_POLL_INTERVAL = 0.1


# --- databases ------------------------------------------------------------------


def database_urls(server_url: str) -> dict[str, str]:
    parts = urlsplit(server_url)
    base = parts.path.lstrip("/") or "postgres"
    return {
        engine: urlunsplit(
            parts._replace(scheme="postgresql", path=f"/{base}_peers_{engine}")
        )
        for engine in ENGINES
    }


def recreate(url: str) -> None:
    import psycopg

    name = urlsplit(url).path.lstrip("/")
    admin = urlunsplit(urlsplit(url)._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


# --- engines ---------------------------------------------------------------------


class EngineProcess:
    """A DBOS or floor process (bench/peers_engine.py), spoken to in JSON lines."""

    def __init__(self, engine: str, url: str, index: int, log_dir: Path) -> None:
        log = open(log_dir / f"{engine}-{index}.log", "a")
        self.process = subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "bench" / "peers_engine.py"),
                engine,
                "--database-url",
                url,
                "--index",
                str(index),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            bufsize=1,
        )
        if not self.receive().get("ready"):
            raise RuntimeError(f"{engine} process {index} did not start")

    def send(self, **command) -> None:
        self.process.stdin.write(json.dumps(command) + "\n")

    def receive(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError("an engine process ended: see its log")
        return json.loads(line)

    def stop(self) -> None:
        self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class Cases:
    """Hands out case numbers, unique over the whole benchmark."""

    def __init__(self) -> None:
        self.next = 0

    def take(self, count: int) -> int:
        first, self.next = self.next, self.next + count
        return first


class Peer:
    """One engine's side: its processes, and what the phases ask of it."""

    def __init__(self, name: str, url: str, log_dir: Path, cases: Cases) -> None:
        self.name, self.url, self.log_dir, self.cases = name, url, log_dir, cases
        self.processes = [EngineProcess(name, url, 0, log_dir)]

    def latency(self, runs: int, first: int) -> list[dict]:
        self.processes[0].send(op="latency", runs=runs, first=first)
        return self.processes[0].receive()["samples"]

    def scale_to(self, count: int) -> None:
        while len(self.processes) > count:
            self.processes.pop().stop()
        while len(self.processes) < count:
            process = EngineProcess(
                self.name, self.url, len(self.processes), self.log_dir
            )
            process.send(op="latency", runs=3, first=self.cases.take(3))  # warm-up
            process.receive()
            self.processes.append(process)

    def throughput(self, runs: int, concurrency: int, first: int) -> dict:
        """Each process runs its share of the cases; one window over all of them."""
        count = len(self.processes)
        for index, process in enumerate(self.processes):
            share = runs // count + (1 if index < runs % count else 0)
            process.send(
                op="throughput",
                runs=share,
                concurrency=max(1, concurrency // count),
                first=first,
            )
            first += share
        windows = [process.receive() for process in self.processes]
        return {
            "started": min(w["started"] for w in windows),
            "ended": max(w["ended"] for w in windows),
            "completed": sum(w["completed"] for w in windows),
            "failures": [f for w in windows for f in w["failures"]],
        }

    def stop(self) -> None:
        self.scale_to(0)


class GatehousePeer:
    def __init__(
        self, stack: GatehouseStack, client: GatehouseClient, cases: Cases
    ) -> None:
        self.name, self.url = "gatehouse", stack.database_url
        self.stack, self.client, self.cases = stack, client, cases

    def latency(self, runs: int, first: int) -> list[dict]:
        return latency_samples(self.client.flow, runs, first)

    def scale_to(self, count: int) -> None:
        self.stack.start_workers(count)
        # Warm-up: each pool process imports and compiles the agent once.
        warm_up = 4 * count
        throughput(self.client.flow, warm_up, 2 * count, self.cases.take(warm_up))

    def throughput(self, runs: int, concurrency: int, first: int) -> dict:
        samples: list[dict] = []

        def flow(case: int) -> dict:
            sample = self.client.flow(case)
            samples.append(sample)
            return sample

        mark = self.client.timing_mark()
        cpu_before = self.stack.cpu_seconds()
        window = throughput(flow, runs, concurrency, first)
        cpu_after = self.stack.cpu_seconds()
        window["samples"] = samples
        window["cpu"] = {
            tier: cpu_after[tier] - cpu_before[tier] for tier in cpu_before
        }
        window["web"] = self.client.timings_since(mark)
        return window

    def stop(self) -> None:
        self.stack.stop()


# --- phases ------------------------------------------------------------------------


def table_rows(url: str) -> dict[str, tuple[int, int, int]]:
    """Rows inserted, updated and deleted so far, by table (pg_stat_user_tables).

    Exact once every backend that wrote has exited: each flushes its counts
    as it exits (an idle one may take a minute under load).
    """
    import psycopg

    name = urlsplit(url).path.lstrip("/")
    admin = urlunsplit(urlsplit(url)._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        deadline = time.monotonic() + 60
        while conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", [name]
        ).fetchone()[0]:
            if time.monotonic() > deadline:
                raise RuntimeError(f"connections to {name} stay open")
            time.sleep(0.2)
    with psycopg.connect(url, autocommit=True) as conn:
        return {
            (table if schema == "public" else f"{schema}.{table}"): (ins, upd, dele)
            for schema, table, ins, upd, dele in conn.execute(
                "SELECT schemaname, relname, n_tup_ins, n_tup_upd, n_tup_del "
                "FROM pg_stat_user_tables"
            )
        }


def rows_per_run(before: dict, after: dict, runs: int) -> dict:
    tables = {}
    for name, counts in after.items():
        old = before.get(name, (0, 0, 0))
        changed = tuple(
            (new - was) / runs for new, was in zip(counts, old, strict=True)
        )
        if any(changed):
            tables[name] = changed
    return {
        "inserted": sum(row[0] for row in tables.values()),
        "updated": sum(row[1] for row in tables.values()),
        "deleted": sum(row[2] for row in tables.values()),
        "tables": tables,
    }


def count_per_run(peer, tally: Tally, runs: int, cases: Cases) -> dict:
    """Transactions and round trips of a complete run, from the proxy's tally.

    The engine's idle background (what it sends with nothing to do) is
    measured first and subtracted for the batch's duration.
    """
    peer.latency(WARM_UP_RUNS, cases.take(WARM_UP_RUNS))  # caches, connections
    idle_from, idle_started = tally.snapshot(), time.monotonic()
    time.sleep(IDLE_SECONDS)
    idle = tally.snapshot() - idle_from
    idle_seconds = time.monotonic() - idle_started
    before, started = tally.snapshot(), time.monotonic()
    samples = peer.latency(runs, cases.take(runs))
    time.sleep(STRAGGLER_SECONDS)
    batch = tally.snapshot() - before
    elapsed = time.monotonic() - started

    def per_run(key: str) -> float:
        return max(0.0, batch[key] - idle[key] / idle_seconds * elapsed) / runs

    return {
        **{key: per_run(key) for key in COUNTED},
        "statement_kinds": {
            key.removeprefix("statement:"): per_run(key)
            for key in batch
            if key.startswith("statement:")
        },
        "background_transactions": idle["transactions"] / idle_seconds,
        "requests": _mean(samples, "requests"),
        "status_calls": _mean(samples, "status_calls"),
    }


def _mean(samples: list[dict], key: str) -> float | None:
    values = [sample[key] for sample in samples if sample.get(key) is not None]
    return statistics.fmean(values) if values else None


def status_call_cost(client: GatehouseClient, tally: Tally, cases: Cases) -> dict:
    """What one status request asks of Postgres (a finished run's, 50 times)."""
    finished = client.flow(cases.take(1))
    path = f"/api/v1/threads/{finished['thread_id']}/runs/{finished['run_id']}"
    time.sleep(STRAGGLER_SECONDS)
    before = tally.snapshot()
    for _ in range(STATUS_CALLS):
        client.request("GET", path)
    calls = tally.snapshot() - before
    return {key: calls[key] / STATUS_CALLS for key in COUNTED}


def count_phase(
    stack: GatehouseStack, api_key: str, urls: dict, log_dir: Path, args, cases: Cases
) -> tuple[dict, dict]:
    """Each engine in turn, started on a counting proxy, counted, stopped.

    Transactions and round trips are the proxy's, over the batch; rows come
    from the table statistics before the engine started and after it exited,
    over every run it made (warm-up included: a run writes what it writes).
    """
    counts, status_cost = {}, {}
    for engine in ENGINES[:1] if args.count_only else ENGINES:
        if engine != "gatehouse":  # its first start creates its tables
            Peer(engine, urls[engine], log_dir, cases).stop()
        rows_before = table_rows(urls[engine])
        proxy = CountingProxy()
        url = proxied_url(urls[engine], proxy.port)
        counted = stack.on_database(url, label="count")
        runs = WARM_UP_RUNS + args.count_runs
        peer = None
        try:
            if engine == "gatehouse":
                counted.start_web()
                client = GatehouseClient(
                    counted.base_url,
                    api_key,
                    waiter=args.wait,
                    interval=COUNT_POLL_INTERVAL,
                )
                peer = GatehousePeer(counted, client, cases)
                counted.start_workers(1)
            else:
                peer = Peer(engine, url, log_dir, cases)
            counts[engine] = count_per_run(peer, proxy.tally, args.count_runs, cases)
            if engine == "gatehouse":
                status_cost = status_call_cost(client, proxy.tally, cases)
                runs += 1
        finally:
            if peer is not None:
                peer.stop()
            counted.stop()
            proxy.close()
        counts[engine].update(rows_per_run(rows_before, table_rows(urls[engine]), runs))
    return counts, status_cost


def latency_rounds(peers: list, rounds: int, per_round: int, cases: Cases) -> dict:
    samples: dict[str, list[dict]] = {peer.name: [] for peer in peers}
    for round_index in range(rounds):
        shift = round_index % len(peers)
        for peer in peers[shift:] + peers[:shift]:
            samples[peer.name].extend(peer.latency(per_round, cases.take(per_round)))
    return samples


def summarise(samples: list[dict]) -> dict:
    summary = {}
    for measure in MEASURES:
        values = [s[measure] for s in samples if s.get(measure) is not None]
        if values:
            summary[measure] = {
                "p50": statistics.median(values),
                "p95": percentile(values, 0.95),
                "n": len(values),
            }
    return summary


def throughput_phase(peers: list, args, cases: Cases) -> dict:
    """Complete runs per second for each worker-process count."""
    results: dict[int, dict] = {}
    for workers in args.worker_counts:
        print(f"throughput with {workers} worker process(es)...", flush=True)
        results[workers] = {}
        for peer in peers:
            if peer.name == "floor" and workers != 1:
                continue  # the floor is one process by definition
            peer.scale_to(workers)
            results[workers][peer.name] = peer.throughput(
                args.throughput_runs,
                args.concurrency,
                cases.take(args.throughput_runs),
            )
            if peer.name != "gatehouse":
                peer.scale_to(1)
    return results


def slow_poll_phase(stack, api_key: str, args, cases: Cases) -> dict:
    """The first throughput figure again, the client polling less often."""
    client = GatehouseClient(
        stack.base_url, api_key, waiter="poll", interval=SLOW_POLL_INTERVAL
    )
    peer = GatehousePeer(stack, client, cases)
    peer.scale_to(args.worker_counts[0])
    window = peer.throughput(
        args.throughput_runs, args.concurrency, cases.take(args.throughput_runs)
    )
    return {"interval": SLOW_POLL_INTERVAL, "window": window}


# --- main ----------------------------------------------------------------------------


def machine() -> str:
    return (
        f"{cpu_model()}, {os.cpu_count()} cores, "
        f"Linux {platform.release()}; Python {platform.python_version()}; "
        "PostgreSQL and Redis on the same machine"
    )


def versions() -> str:
    names = [
        "dbos",
        "langgraph",
        "langgraph-checkpoint-postgres",
        "Django",
        "celery",
        "gunicorn",
        "psycopg",
    ]
    return ", ".join(f"{name} {version(name)}" for name in names)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short run")
    parser.add_argument("--rounds", type=int, help="latency rounds (10; quick 3)")
    parser.add_argument(
        "--per-round", type=int, help="runs per engine per round (10; quick 4)"
    )
    parser.add_argument(
        "--throughput-runs", type=int, help="runs per throughput figure (300; quick 60)"
    )
    parser.add_argument("--concurrency", type=int, default=20)
    parser.add_argument(
        "--workers", default=None, help="worker-process counts (1,2,4; quick 1,2)"
    )
    parser.add_argument(
        "--count-runs", type=int, help="runs counted per engine (20; quick 5)"
    )
    parser.add_argument(
        "--wait",
        choices=("wait", "poll", "join"),
        default="wait",
        help="how the Gatehouse client learns a run stopped: the REST run's "
        "long poll (?wait=), which answers when the run stops (as DBOS's "
        "client waits on get_result); poll its status; or the Agent "
        "Protocol's runs/join, then its status",
    )
    parser.add_argument(
        "--poll-interval",
        type=float,
        default=0.01,
        help="seconds between the Gatehouse client's status checks (0.01)",
    )
    parser.add_argument(
        "--web-server",
        choices=sorted(WEB_SERVERS),
        default="asgi",
        help="how Gatehouse's web process is served (asgi: as README.md says)",
    )
    parser.add_argument(
        "--web-workers",
        type=int,
        default=os.cpu_count() or 1,
        help="gunicorn workers (one per core, as README.md says)",
    )
    parser.add_argument(
        "--redis-url",
        default="redis://127.0.0.1:6379/13",
        help="Gatehouse's Redis database, FLUSHED; never one a test suite uses at "
        "the same time: its workers would take the suite's tasks (db 13)",
    )
    parser.add_argument(
        "--no-doc", action="store_true", help="print only; leave docs/ alone"
    )
    parser.add_argument(
        "--count-only",
        action="store_true",
        help="only count what a Gatehouse run asks of Postgres, print it and stop",
    )
    args = parser.parse_args()
    quick = args.quick
    for name, full, short in (
        ("rounds", 10, 3),
        ("per_round", 10, 4),
        ("throughput_runs", 300, 60),
        ("count_runs", 20, 5),
    ):
        if getattr(args, name) is None:
            setattr(args, name, short if quick else full)
    workers = args.workers or ("1,2" if quick else "1,2,4")
    args.worker_counts = [int(count) for count in workers.split(",")]
    if args.redis_url.rstrip("/").endswith("/15"):
        parser.error("Redis db 15 is the test suite's; pick another")
    return args


def main() -> None:
    args = parse_args()
    urls = database_urls(os.environ.get("DATABASE_URL") or DEFAULT_SERVER)
    for url in urls.values():
        recreate(url)
    log_dir = Path(tempfile.mkdtemp(prefix="gatehouse-bench-peers-"))
    print(f"logs: {log_dir}", flush=True)
    settings = {
        **vars(args),
        "count_poll_interval": COUNT_POLL_INTERVAL,
        "machine": machine(),
        "versions": versions(),
        "load_start": load_average(),
        "when": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }
    cases = Cases()
    stack = GatehouseStack(
        env=production_env(urls["gatehouse"], args.redis_url),
        web_server=args.web_server,
        web_workers=args.web_workers,
        log_dir=log_dir,
        label="main",
    )
    api_key = stack.prepare()
    results: dict = {}
    print("counting what a run asks of Postgres...", flush=True)
    results["counts"], results["status_cost"] = count_phase(
        stack, api_key, urls, log_dir, args, cases
    )
    if args.count_only:
        print(json.dumps(results, indent=1, default=str))
        return
    peers: list = []
    try:
        stack.start_web()
        client = GatehouseClient(
            stack.base_url, api_key, waiter=args.wait, interval=args.poll_interval
        )
        peers = [GatehousePeer(stack, client, cases)] + [
            Peer(engine, urls[engine], log_dir, cases) for engine in ENGINES[1:]
        ]
        peers[0].scale_to(1)
        for peer in peers[1:]:
            peer.latency(3, cases.take(3))  # warm-up
        print("latency rounds...", flush=True)
        mark = client.timing_mark()
        samples = latency_rounds(peers, args.rounds, args.per_round, cases)
        results["latency"] = {name: summarise(s) for name, s in samples.items()}
        results["anatomy"] = anatomy(urls["gatehouse"], samples["gatehouse"])
        polls = client.timings_since(mark).get("poll run")
        if polls and results["status_cost"]:
            results["status_cost"]["p50"] = statistics.median(polls)
        results["throughput"] = throughput_phase(peers, args, cases)
        if args.wait == "poll":
            results["slow_poll"] = slow_poll_phase(stack, api_key, args, cases)
    finally:
        for peer in peers:
            peer.stop()
        stack.stop()
    settings["load_end"] = load_average()
    text = report(settings, results)
    print(text)
    if not args.no_doc:
        write_section(f"Side by side, {'quick' if args.quick else 'full'} run", text)


if __name__ == "__main__":
    main()
