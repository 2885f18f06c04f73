"""The worker's CPU per refund run, as runs.execution.execute spends it.

In one process: production settings as a worker has them (persistent
database connections, no pool; the Redis cache and broker), and for each
iteration a refund thread created and its run started through
config/asgi.py's application (not timed), the run executed on one thread,
as a worker's pool process executes its tasks, up to its approval gate
(`start`), the approval decided through the application (not timed), and
the resume run executed to its success (`resume`). Each execution's CPU is time.process_time (the whole process:
the graph's pool threads and the lease thread included), with its SQL
statements (psycopg, the checkpointer's too) and the CPU spent inside them.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/gh_NAME \
    CELERY_BROKER_URL=redis://127.0.0.1:6379/N python bench/worker_probe.py [-n 60]

`--profile FILE`: cProfile over the executions (time.thread_time), every
thread that runs a part of them (the caller's and the graph's pool threads),
merged; prints the top functions by own and cumulative time and dumps the
stats to FILE. `--split module:qualname` (repeatable): that function's calls
and CPU per complete run, inclusive, on the thread that ran it. `--show`:
the statements of one run, with their CPU. `--ab FILE`: FILE defines
`switch(on)`, called before each flow with on for half of them, in the
order A B B A (patch a function and its imports by name to compare two
versions in one process, interleaved, whatever the load on the machine;
with A B A B an A/A run, a switch that does nothing, measured the B half
1 ms a run pair costlier: something in the flows goes by twos); both
halves' figures, the
splits' too (split a caller of what the switch swaps, not the function
itself: the switch would swap the split's wrapper away).
`--celery`: executes through the Celery task's tracer (as a pool process
runs it: signals, the connection handling around it) instead of calling
execute.

Migrates the database it is given; leaves its rows there. Flushes the
broker's Redis database.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

# A worker's connections: persistent, one per thread (config.settings), not
# the web process's pool (config/asgi.py turns it on by default); the rest of
# the environment is decision_probe's, set when it is imported.
os.environ["DATABASE_POOL"] = "false"

import decision_probe as dp  # noqa: E402  (django.setup())
import psycopg  # noqa: E402
import redis  # noqa: E402


class Counts:
    def __init__(self) -> None:
        self.on = False
        self.show = False
        self.statements = 0
        self.sql_cpu = 0.0
        self.lock = threading.Lock()


COUNTS = Counts()


def instrument_sql() -> None:
    original = psycopg.Cursor.execute

    def execute(self, *args, **kwargs):
        if not COUNTS.on:
            return original(self, *args, **kwargs)
        c0, t0 = time.process_time(), time.thread_time()
        try:
            return original(self, *args, **kwargs)
        finally:
            with COUNTS.lock:
                COUNTS.statements += 1
                COUNTS.sql_cpu += time.process_time() - c0
            if COUNTS.show:
                text = " ".join(str(args[0]).split())
                print(
                    f"  {(time.thread_time() - t0) * 1000:5.2f} ms CPU"
                    f" [{threading.current_thread().name[:12]:12s}] {text[:150]}"
                )

    psycopg.Cursor.execute = execute


class Profiles:
    """One cProfile per thread that runs a part of an execution."""

    def __init__(self) -> None:
        self.on = False
        self.all: list[cProfile.Profile] = []
        self.local = threading.local()

    def mine(self) -> cProfile.Profile:
        profile = getattr(self.local, "profile", None)
        if profile is None:
            profile = self.local.profile = cProfile.Profile(time.thread_time)
            self.all.append(profile)
        return profile


PROFILES = Profiles()


def instrument_pool() -> None:
    from runs import graph_executor

    original = graph_executor._in_run

    def in_run(run, fn, /, *args, **kwargs):
        if not PROFILES.on:
            return original(run, fn, *args, **kwargs)
        profile = PROFILES.mine()
        profile.enable()
        try:
            return original(run, fn, *args, **kwargs)
        finally:
            profile.disable()

    graph_executor._in_run = in_run


# name -> [calls, CPU seconds] of each half of an A/B (B's while SPLIT_B.on),
# the one half without.
SPLITS: dict[str, list] = {}
SPLITS_B: dict[str, list] = {}


class SPLIT_B:  # noqa: N801  a flag: the flow under way is an A/B's B half
    on = False


_SPLIT_DEPTH = threading.local()


def instrument_splits(names: list[str]) -> None:
    """Each `module:qualname` wrapped: its calls and their CPU (time.thread_time,
    its own thread's), inclusive; a recursive call counts once."""
    import importlib

    for name in names:
        module, _, qualname = name.partition(":")
        owner = importlib.import_module(module)
        *path, attr = qualname.split(".")
        for part in path:
            owner = getattr(owner, part)
        original = owner.__dict__[attr]
        SPLITS[name], SPLITS_B[name] = [0, 0.0], [0, 0.0]

        def wrapper(*args, __original=original, __name=name, **kwargs):
            if not COUNTS.on:
                return __original(*args, **kwargs)
            depth = getattr(_SPLIT_DEPTH, __name, 0)
            setattr(_SPLIT_DEPTH, __name, depth + 1)
            c0 = time.thread_time()
            try:
                return __original(*args, **kwargs)
            finally:
                setattr(_SPLIT_DEPTH, __name, depth)
                if depth == 0:
                    figures = (SPLITS_B if SPLIT_B.on else SPLITS)[__name]
                    figures[0] += 1
                    figures[1] += time.thread_time() - c0

        if isinstance(original, staticmethod | classmethod):
            raise TypeError(f"{name}: wrap the function, not a {type(original)}")
        setattr(owner, attr, wrapper)
        # And wherever it was imported by name.
        for other in list(sys.modules.values()):
            for key, value in list(getattr(other, "__dict__", {}).items()):
                if value is original and other is not owner:
                    setattr(other, key, wrapper)


async def started_run(secret: str, case: str) -> str:
    status, _, _ = await dp.call(
        "POST", "/api/v1/threads", secret, {"thread_id": case, "agent": "refund"}
    )
    assert status == 201, status
    status, run, _ = await dp.call(
        "POST",
        f"/api/v1/threads/{case}/runs",
        secret,
        {
            "input": {
                "customer_message": "My blender arrived damaged, please refund me.",
                "order": {"id": "A-1", "amount": "40.00", "currency": "EUR"},
            }
        },
    )
    assert status == 202, (status, run)
    return run["run_id"]


async def decided(secret: str, case: str) -> str:
    from urllib.parse import urlencode

    from asgiref.sync import sync_to_async

    from runs.models import Run

    query = urlencode({"thread_id": case, "status": "pending"})
    status, page, _ = await dp.call("GET", f"/api/v1/approvals?{query}", secret)
    assert status == 200, page
    approval_id = page["results"][0]["id"]
    status, body, _ = await dp.call(
        "POST",
        f"/api/v1/approvals/{approval_id}/decision",
        secret,
        {"approved": True, "reviewer": "probe"},
    )
    assert status == 200, body

    def queued():
        # The thread's latest run (a worker may have taken it already).
        return str(
            Run.objects.filter(thread__thread_id=case)
            .order_by("-created_at")
            .values_list("pk", flat=True)[0]
        )

    return await sync_to_async(queued, thread_sensitive=False)()


def executor(celery: bool):
    """What executes a run: execute, or the Celery task as a worker runs it."""
    from runs import execution

    if not celery:
        return execution.execute
    from celery.app.trace import build_tracer

    from config.celery import app
    from runs.tasks import execute_run

    tracer = build_tracer(execute_run.name, execute_run, app=app, eager=False)

    def through_task(run_id: str) -> None:
        import uuid

        task_id = str(uuid.uuid4())
        request = {
            "id": task_id,
            "task": execute_run.name,
            "delivery_info": {},
            "hostname": "probe",
        }
        retval, info, *_ = tracer(task_id, (run_id,), {}, request)
        if info is not None and info.state != "SUCCESS":
            raise RuntimeError(info)

    return through_task


def timed(fn, run_id: str, profile: bool):
    COUNTS.statements, COUNTS.sql_cpu = 0, 0.0
    main = PROFILES.mine() if profile else None
    COUNTS.on = True
    PROFILES.on = profile
    c0 = time.process_time()
    if main:
        main.enable()
    fn(run_id)
    if main:
        main.disable()
    cpu = time.process_time() - c0
    COUNTS.on = False
    PROFILES.on = False
    return cpu, COUNTS.statements, COUNTS.sql_cpu


def report(results: dict, label: str) -> None:
    n = len(results["start"])
    print(f"{n} refund runs {label} (ms per execution: mean, median; CPU)")
    total = 0.0
    for phase, rows in results.items():
        cpu = [r[0] * 1000 for r in rows]
        sql = [r[2] * 1000 for r in rows]
        total += statistics.mean(cpu)
        print(
            f"  {phase:6s} CPU {statistics.mean(cpu):6.2f} {statistics.median(cpu):6.2f}"
            f"  statements {statistics.mean(r[1] for r in rows):5.1f}"
            f"  CPU in statements {statistics.mean(sql):5.2f}"
        )
    print(f"  both   CPU {total:6.2f}")


async def main(args) -> None:
    from asgiref.sync import sync_to_async

    from runs.models import Run

    tenant, secret = await sync_to_async(dp.setup_tenant, thread_sensitive=False)()
    redis.Redis.from_url(dp.BROKER).flushdb()
    instrument_sql()
    instrument_pool()
    instrument_splits(args.split)
    run_it = executor(args.celery)
    # The executions on one thread, as a worker process runs its tasks.
    worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="worker")
    loop = asyncio.get_running_loop()
    results = {"start": [], "resume": []}
    switch = None
    if args.ab:
        namespace: dict = {}
        exec(compile(Path(args.ab).read_text(), args.ab, "exec"), namespace)
        switch = namespace["switch"]
        results_b = {"start": [], "resume": []}
    stamp = int(time.time() * 1000)
    for i in range(args.n + args.warm):
        case = f"w{stamp}-{i}"
        if i == args.warm:
            for figures in (*SPLITS.values(), *SPLITS_B.values()):
                figures[:] = [0, 0.0]
        profile = bool(args.profile) and i >= args.warm
        b_side = switch is not None and i % 4 in (1, 2)
        if switch is not None:
            switch(b_side)
        SPLIT_B.on = b_side
        COUNTS.show = args.show and i == args.warm
        for phase in ("start", "resume"):
            if phase == "start":
                run_id = await started_run(secret, case)
            else:
                run_id = await decided(secret, case)
            if COUNTS.show:
                print(f"{phase}:")
            figures = await loop.run_in_executor(worker, timed, run_it, run_id, profile)
            status = await sync_to_async(
                lambda pk=run_id: Run.objects.get(pk=pk).status, thread_sensitive=False
            )()
            expected = "interrupted" if phase == "start" else "succeeded"
            assert status == expected, (phase, status)
            if i >= args.warm:
                (results_b if b_side else results)[phase].append(figures)
        if i % 20 == 0:
            redis.Redis.from_url(dp.BROKER).flushdb()
    report(results, "" if switch is None else "A (switch off)")
    if switch is not None:
        report(results_b, "B (switch on)")
    halves = [("", SPLITS, args.n)]
    if switch is not None:
        halves = [("A ", SPLITS, len(results["start"]))]
        halves.append(("B ", SPLITS_B, len(results_b["start"])))
    for label, splits, runs in halves:
        if splits and runs:
            print(f"{label}CPU per complete run (start + resume), ms, inclusive:")
            for name, (calls, cpu) in splits.items():
                print(f"  {cpu * 1000 / runs:6.2f}  {calls / runs:5.1f} calls  {name}")
    if args.profile:
        stats = pstats.Stats(PROFILES.all[0])
        for other in PROFILES.all[1:]:
            stats.add(other)
        stats.dump_stats(args.profile)
        stats.sort_stats("tottime").print_stats(args.top)
        stats.sort_stats("cumulative").print_stats(args.top)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=60)
    parser.add_argument("--warm", type=int, default=5)
    parser.add_argument("--profile", default="")
    parser.add_argument("--top", type=int, default=60)
    parser.add_argument("--celery", action="store_true")
    parser.add_argument(
        "--ab",
        default="",
        help="a Python file defining switch(on): called before each flow, "
        "on for half of them (A B B A); the figures of both halves are shown",
    )
    parser.add_argument(
        "--show", action="store_true", help="list the statements of one run"
    )
    parser.add_argument(
        "--split",
        action="append",
        default=[],
        help="module:qualname whose CPU to show per run (repeatable)",
    )
    asyncio.run(main(parser.parse_args()))
