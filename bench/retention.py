"""Retention benchmark: the TTL expiry sweep against a large backlog.

    make bench-retention              # or: python bench/retention.py --help

Works in its own database, `gatehouse_bench_retention` on the server that
DATABASE_URL names (created and dropped here). It loads 1 million expired
checkpoints across 10,000 threads (100 each, with one channel blob and two
pending writes per checkpoint, as ciphertext-sized random bytes) with COPY,
then measures:

1. the expiry job (the `expire_threads` job, in its own process, as a Celery
   worker would run it) removing the whole backlog in windows of a few
   seconds with pauses between them, while writer processes run the
   checkpoint benchmark's workload (DjangoSaver `put` and `put_writes`,
   messages of ~500 bytes) all along, paced at a steady rate as live runs
   write: its checkpoints removed per second under that load, and the p99
   latency of the writes during the windows and during the pauses;
2. the job's rate alone, on a freshly loaded backlog.

`--scale 0.1` loads a tenth (100,000 checkpoints). Results go to the
"Retention" section of docs/benchmarks.md (`--no-doc` to skip).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

DB_NAME = "gatehouse_bench_retention"
CHECKPOINTS_PER_THREAD = 100
THREADS_AT_SCALE_1 = 10_000
TARGET_ROWS_PER_SECOND = 20_000
TARGET_P99_RATIO = 2.0
# Writes in the first seconds (connections, caches) count in neither set.
WARM_UP_SECONDS = 2.0


# --- database and Django ---------------------------------------------------------


def _with_database(server_url: str, name: str) -> str:
    return urlunsplit(urlsplit(server_url)._replace(path=f"/{name}"))


def _create_database(server_url: str) -> str:
    import psycopg

    with psycopg.connect(_with_database(server_url, "postgres"), autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')
        c.execute(f'CREATE DATABASE "{DB_NAME}"')
    return _with_database(server_url, DB_NAME)


def _drop_database(server_url: str) -> None:
    import psycopg

    with psycopg.connect(_with_database(server_url, "postgres"), autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')


def _environment(bench_url: str) -> dict[str, str]:
    env = dict(os.environ)
    env["DATABASE_URL"] = bench_url
    env["DJANGO_SETTINGS_MODULE"] = "config.settings"
    env.setdefault("SECRET_KEY", "benchmark-only-secret-key")
    env.setdefault(
        "GATEHOUSE_MASTER_KEYS", "bench:" + base64.b64encode(os.urandom(32)).decode()
    )
    env.setdefault(
        "GATEHOUSE_AUDIT_KEYS",
        "bench-audit:" + base64.b64encode(os.urandom(32)).decode(),
    )
    env.setdefault("LOG_LEVEL", "WARNING")
    env.setdefault("ALLOWED_HOSTS", "localhost")
    env["PYTHONPATH"] = str(ROOT)
    return env


def _setup_django(env: dict[str, str]) -> None:
    os.environ.update(env)
    import django

    django.setup()


# --- the backlog -------------------------------------------------------------------


def _hex(value: bytes) -> str:
    return "\\\\x" + value.hex()


def load_backlog(threads: int) -> int:
    """Expired threads with their checkpoints, blobs and writes; checkpoints.

    COPY in text format, the rows formatted here from a small pool of random
    payloads (ciphertext does not compress, so repeats cost what unique
    bytes would).
    """
    from django.db import connection
    from django.utils import timezone

    from runs.models import ChannelBlob, Checkpoint, PendingWrite, Tenant, Thread
    from runs.models.checkpoints import compact_id

    rng = random.Random(7)
    pool = [_hex(bytes([1]) + rng.randbytes(n)) for n in (180, 220, 260) * 8]
    metas = [_hex(bytes([1]) + rng.randbytes(n)) for n in (90, 110, 130) * 8]
    blobs = [_hex(bytes([1]) + rng.randbytes(n)) for n in (380, 450, 520) * 8]
    writes = [_hex(bytes([1]) + rng.randbytes(n)) for n in (90, 120, 150) * 8]
    tenant = Tenant.objects.create(slug=f"backlog-{uuid.uuid4().hex[:6]}", name="x")
    long_ago = timezone.now() - timedelta(days=400)
    Thread.objects.bulk_create(
        [
            Thread(
                tenant=tenant,
                thread_id=f"old-{n:06}",
                agent_name="refund",
                agent_version="1",
                wrapped_data_key=rng.randbytes(61),
                data_key_id="bench",
                created_at=long_ago,
            )
            for n in range(threads)
        ],
        batch_size=2000,
    )
    Thread.objects.filter(tenant=tenant).update(updated_at=long_ago)
    pks = list(Thread.objects.filter(tenant=tenant).values_list("pk", flat=True))
    stamp = long_ago.isoformat()
    steps = range(CHECKPOINTS_PER_THREAD)
    ids = [f"1f0{step:05}" for step in steps]
    versions = [f"{step + 1:032}.0" for step in steps]

    def stored_id(text: str) -> str:
        return _hex(compact_id(text))

    def checkpoint_rows(pk: int):
        for step in steps:
            parent = stored_id(f"{ids[step - 1]}-{pk:08}" if step else "")
            yield (
                f"{pk}\t\t{stored_id(f'{ids[step]}-{pk:08}')}\t{parent}\t{step}\t"
                "loop\t\t"
                f'{{"messages": "{versions[step]}"}}\t{pool[step % 24]}\t'
                f"{metas[step % 24]}\t{stamp}\n"
            )

    def blob_rows(pk: int):
        for step in steps:
            yield f"{pk}\t\tmessages\t{versions[step]}\t{blobs[step % 24]}\n"

    def write_rows(pk: int):
        for step in steps:
            for idx, channel in enumerate(("messages", "tokens")):
                yield (
                    f"{pk}\t\t{stored_id(f'{ids[step]}-{pk:08}')}\t"
                    f"{stored_id(f'task-{step}')}\t{idx}\t{channel}"
                    f"\t\t{writes[(step + idx) % 24]}\n"
                )

    tables = (
        (
            Checkpoint,
            "thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, step, "
            "source, run_id, blob_versions, checkpoint, metadata, created_at",
            checkpoint_rows,
        ),
        (ChannelBlob, "thread_id, checkpoint_ns, channel, version, value", blob_rows),
        (
            PendingWrite,
            "thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, "
            "task_path, value",
            write_rows,
        ),
    )
    with connection.connection.cursor() as cursor:
        # A bulk load's usual trick: no foreign-key triggers while loading rows
        # whose thread ids were just read from the table (superuser only).
        cursor.execute("SET session_replication_role = replica")
        for model, columns, rows in tables:
            sql = f"COPY {model._meta.db_table} ({columns}) FROM STDIN"
            with cursor.copy(sql) as copy:
                for pk in pks:
                    copy.write("".join(rows(pk)))
        cursor.execute("SET session_replication_role = DEFAULT")
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")
    return len(pks) * CHECKPOINTS_PER_THREAD


def _load(env: dict[str, str], threads: int) -> tuple[int, float]:
    started = time.perf_counter()
    output = _child(env, "--load", str(threads))
    return int(output["checkpoints"]), time.perf_counter() - started


# --- child processes: loader, sweeper, writers ------------------------------------


def _child(env: dict[str, str], *args: str) -> dict:
    finished = subprocess.run(
        [sys.executable, __file__, *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if finished.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{finished.stderr}")
    return json.loads(finished.stdout.strip().splitlines()[-1])


def run_sweep(batch_size: int | None) -> dict:
    """The whole backlog in one job run."""
    from retention.jobs import job_run

    report = job_run("expire_threads", batch_size=batch_size)
    return {"seconds": report.seconds, "checkpoints": report.totals["checkpoints"]}


def run_alternating(batch_size: int | None, window: float) -> dict:
    """Pause and sweep in turns of `window` seconds until the backlog is gone.

    Each sweep window is one job run with a time budget (it stops between
    batches); the wall-clock bounds of the windows let the writers' calls be
    told apart: during a sweep, or not.
    """
    from retention.jobs import job_run

    windows = []
    while True:
        time.sleep(window)
        started = time.time()
        report = job_run("expire_threads", batch_size=batch_size, time_budget=window)
        removed = report.totals["checkpoints"]
        if not removed:
            break
        windows.append((started, time.time(), removed))
    time.sleep(window)
    return {"windows": windows}


def run_writer(seconds: float, rate: float, stop_file: str, seed: int) -> dict:
    """Paced put/put_writes (the checkpoint benchmark's workload); latencies."""
    from checkpoints import Workload

    from runs.checkpointer import DjangoSaver
    from runs.models import Tenant

    tenant = Tenant.objects.create(slug=f"live-{uuid.uuid4().hex[:8]}", name="live")
    saver = DjangoSaver(tenant=tenant)
    latencies: list[tuple[float, float]] = []
    interval = 1.0 / rate
    deadline = time.monotonic() + seconds
    next_call = time.monotonic()
    workload = None
    steps = 0
    while time.monotonic() < deadline and not os.path.exists(stop_file):
        if workload is None or steps >= 200:
            workload = Workload(saver, f"live-{seed}-{uuid.uuid4().hex[:8]}", window=20)
            steps = 0
        config, checkpoint, metadata, new_versions, step_writes = workload.next_step()
        for call in ("put", "put_writes"):
            pause = next_call - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            next_call += interval
            at = time.time()
            started = time.perf_counter()
            if call == "put":
                workload.parent = saver.put(config, checkpoint, metadata, new_versions)
            else:
                saver.put_writes(workload.parent, step_writes, str(uuid.uuid4()))
            latencies.append((at, time.perf_counter() - started))
        steps += 1
    return {"latencies": latencies}


def _start_writers(env, count: int, seconds: float, rate: float, stop_file: str):
    return [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--write",
                str(seconds),
                str(rate),
                stop_file,
                str(seed),
            ],
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed in range(count)
    ]


def _collect(writers) -> list[tuple[float, float]]:
    latencies: list[tuple[float, float]] = []
    for writer in writers:
        out, err = writer.communicate(timeout=1800)
        if writer.returncode != 0:
            raise SystemExit(f"writer failed:\n{err}")
        latencies += [
            tuple(pair) for pair in json.loads(out.splitlines()[-1])["latencies"]
        ]
    return latencies


# --- measurement -----------------------------------------------------------------


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def measure(args, env: dict[str, str]) -> dict:
    threads = max(10, int(THREADS_AT_SCALE_1 * args.scale))
    results: dict = {"threads": threads}
    checkpoints, seconds = _load(env, threads)
    results.update(checkpoints=checkpoints, load_seconds=seconds)
    print(f"loaded {checkpoints:,} expired checkpoints in {seconds:.0f} s")

    # Writers all along; the sweep in windows, with pauses of the same length
    # between them: a busy moment of the machine falls on both alike.
    stop_file = tempfile.mktemp(prefix="gatehouse-bench-stop-")
    writers = _start_writers(env, args.writers, 3600, args.rate, stop_file)
    batch = ["--batch-size", str(args.batch_size)] if args.batch_size else []
    try:
        windows = _child(env, "--alternate", str(args.window), *batch)["windows"]
    finally:
        Path(stop_file).touch()
    calls = _collect(writers)
    os.unlink(stop_file)
    first = windows[0][0] - args.window + WARM_UP_SECONDS
    during = [lat for at, lat in calls if _inside(at, windows)]
    without = [lat for at, lat in calls if at >= first and not _inside(at, windows)]
    removed = sum(count for _, _, count in windows)
    sweeping = sum(end - start for start, end, _ in windows)
    results.update(
        baseline=without,
        during=during,
        windows=len(windows),
        sweep_loaded={"checkpoints": removed, "seconds": sweeping},
    )
    print(
        f"sweep beside the writes: {removed:,} checkpoints in {sweeping:.1f} s "
        f"({len(windows)} windows) = {removed / sweeping:,.0f}/s; write p99 "
        f"{percentile(without, 0.99) * 1000:.2f} ms between the windows, "
        f"{percentile(during, 0.99) * 1000:.2f} ms during them"
    )
    if removed != checkpoints:
        raise SystemExit(f"the sweep removed {removed} of {checkpoints}")

    _load(env, threads)
    alone = _child(env, "--sweep", *batch)
    results["sweep_alone"] = alone
    print(
        f"sweep alone: {alone['checkpoints']:,} checkpoints in "
        f"{alone['seconds']:.1f} s = {alone['checkpoints'] / alone['seconds']:,.0f}/s"
    )
    return results


def _inside(at: float, windows) -> bool:
    return any(start <= at <= end for start, end, _ in windows)


# --- report ------------------------------------------------------------------------


def _machine(env: dict[str, str]) -> dict[str, str]:
    import psycopg
    from benchmarks_doc import cpu_model, load_average

    cpu = cpu_model()
    with psycopg.connect(env["DATABASE_URL"]) as conn:
        server = conn.execute("SHOW server_version").fetchone()[0]
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{cpu}, {os.cpu_count()} cores",
        "load": load_average(),
        "python": platform.python_version(),
        "postgres": server,
    }


def report(args, env, results: dict) -> str:
    machine = _machine(env)
    base, during = results["baseline"], results["during"]
    loaded, alone = results["sweep_loaded"], results["sweep_alone"]
    rate_loaded = loaded["checkpoints"] / loaded["seconds"]
    rate_alone = alone["checkpoints"] / alone["seconds"]
    p99_base, p99_during = percentile(base, 0.99), percentile(during, 0.99)
    ratio = p99_during / p99_base
    per_thread = CHECKPOINTS_PER_THREAD
    lines = [
        "## Retention",
        "",
        f"`bench/retention.py` (`make bench-retention`), run {machine['date']}"
        + (f", scale {args.scale}" if args.scale != 1 else "")
        + ".",
        "",
        f"- Machine: {machine['machine']}; Python {machine['python']}; "
        f"PostgreSQL {machine['postgres']} on the same machine (load average "
        f"{machine['load']} at the end: figures vary with what else runs).",
        f"- Backlog: {results['checkpoints']:,} expired checkpoints across "
        f"{results['threads']:,} threads ({per_thread} each, with one channel blob "
        "and two pending writes per checkpoint: "
        f"{results['checkpoints'] * 4:,} rows), loaded with COPY in "
        f"{results['load_seconds']:.0f} s and vacuumed.",
        "- Sweep: the `expire_threads` job in its own process, batches of "
        f"{args.batch_size or os.environ.get('GATEHOUSE_RETENTION_BATCH_SIZE', 50)} "
        "threads, each one transaction "
        "(threads locked SKIP LOCKED, keys shredded, rows deleted, one "
        "`thread.deleted` tombstone per thread).",
        f"- Writes: {args.writers} writer processes running the checkpoint "
        "benchmark's workload (DjangoSaver `put` + `put_writes`, ~500-byte "
        f"messages, a window of 20), each paced at {args.rate:g} calls/s, all "
        f"along; the sweep runs in {results['windows']} windows of "
        f"{args.window:g} s (one job run with that time budget each) with pauses "
        "of the same length between them, so that whatever else loads the "
        "machine falls on both sets alike. Each call counts as *with the sweep* "
        "when it started inside a window, *without* when it started in a pause.",
        "",
        "| measure | value |",
        "|---|---:|",
        f"| expiry sweep alone | {rate_alone:,.0f} checkpoints/s "
        f"({alone['checkpoints']:,} in {alone['seconds']:.1f} s) |",
        f"| expiry sweep during the writes | {rate_loaded:,.0f} checkpoints/s "
        f"({loaded['checkpoints']:,} in {loaded['seconds']:.1f} s) |",
        f"| rows removed per second (sweep alone, all four tables) | "
        f"{4 * rate_alone:,.0f} |",
        f"| write p50 without / with the sweep | "
        f"{statistics.median(base) * 1000:.2f} ms / "
        f"{statistics.median(during) * 1000:.2f} ms |",
        f"| write p99 without the sweep | {p99_base * 1000:.2f} ms "
        f"({len(base):,} calls) |",
        f"| write p99 with the sweep | {p99_during * 1000:.2f} ms "
        f"({len(during):,} calls) |",
        f"| p99 ratio (with / without) | {ratio:.2f}x |",
        "",
        f"- {'met' if rate_alone >= TARGET_ROWS_PER_SECOND else 'MISSED'}: at least "
        f"{TARGET_ROWS_PER_SECOND:,} checkpoints removed per second "
        f"({rate_alone:,.0f}/s alone, {rate_loaded:,.0f}/s beside the writes).",
        f"- {'met' if ratio <= TARGET_P99_RATIO else 'MISSED'}: concurrent write "
        f"p99 with the sweep at most {TARGET_P99_RATIO:g}x its value without "
        f"({ratio:.2f}x).",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scale", type=float, default=1.0, help="of 10,000 threads")
    parser.add_argument("--writers", type=int, default=2)
    parser.add_argument("--rate", type=float, default=50, help="calls/s per writer")
    parser.add_argument(
        "--window", type=float, default=5, help="seconds of each sweep and pause"
    )
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the database")
    parser.add_argument("--no-doc", action="store_true")
    # Child process modes.
    parser.add_argument("--load", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--sweep", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--alternate", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--write", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.load is not None or args.sweep or args.alternate or args.write:
        _setup_django(dict(os.environ))
        if args.load is not None:
            print(json.dumps({"checkpoints": load_backlog(args.load)}))
        elif args.sweep:
            print(json.dumps(run_sweep(args.batch_size)))
        elif args.alternate:
            print(json.dumps(run_alternating(args.batch_size, args.alternate)))
        else:
            seconds, rate, stop_file, seed = args.write
            print(
                json.dumps(
                    run_writer(float(seconds), float(rate), stop_file, int(seed))
                )
            )
        return

    server = os.environ.get(
        "DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"
    )
    if not server.startswith("postgres"):
        raise SystemExit("DATABASE_URL must name a Postgres server")
    bench_url = _create_database(server)
    env = _environment(bench_url)
    try:
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "--verbosity", "0"],
            env=env,
            cwd=ROOT,
            check=True,
        )
        results = measure(args, env)
        text = report(args, env, results)
        print()
        print(text)
        if not args.no_doc:
            from benchmarks_doc import write_section

            write_section("Retention", text)
    finally:
        if not args.keep:
            _drop_database(server)


if __name__ == "__main__":
    main()
