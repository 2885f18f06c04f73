"""The hop from a task's send to its start in a real Celery worker.

Starts `celery -A config worker --concurrency=2` (production settings, as
bench/peers_gatehouse.py starts it; more worker flags after `--`), sends
`runs.execute_run` for runs that do not exist (the worker looks the run up,
finds nothing and returns: the claim's first statements) one at a time, a
pause between them, as runs.dispatch sends them after a commit, and prints
where the time from the send to the task's start goes: the send itself
(apply_async, in this process), send -> readable (the BRPOP reply is there
for the worker's parent to read), readable -> received (kombu takes the
message: parse, note it unacked in Redis, a round trip; Celery's request:
its task_received signal), received -> started (the job to a pool process
and Celery's tracer there, to task_prerun); then the CPU per task of the
worker's parent and of each pool process, less what each spends idle over
as long (measured first, in clock ticks: 10 ms). The marks are Redis pushes
made after their time is taken: ~0.1 ms of the parent's CPU a task.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/gh_NAME \
    CELERY_BROKER_URL=redis://127.0.0.1:6379/N \
    python bench/celery_hop.py [-n 300] [--gap 0.02] [--profile FILE] \
        [-- --pool=threads --without-gossip ...]

`--profile FILE`: cProfile (CPU time) of the worker's parent process over
the measured tasks, dumped to FILE, its top functions printed.
Flushes the broker's Redis database; migrates nothing (run it on a migrated
database: the task reads the runs table).
"""

from __future__ import annotations

import argparse
import os
import pstats
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

MARKS = "hop:marks"  # a list of "<kind> <task id> <time.time()>"
PROFILE_ON, PROFILE_OFF = signal.SIGRTMIN + 1, signal.SIGRTMIN + 2


def worker_side(argv: list[str]) -> None:
    """In the worker process: the marks, then Celery's own main."""
    import cProfile

    import redis
    from celery import signals
    from kombu.transport import redis as kombu_redis

    from config.celery import app

    marks = redis.Redis.from_url(os.environ["CELERY_BROKER_URL"])
    readable = [0.0]
    brpop_read = kombu_redis.Channel._brpop_read

    def _brpop_read(self, **options):
        # When the message's BRPOP reply is there to read in the parent.
        readable[0] = time.time()
        return brpop_read(self, **options)

    kombu_redis.Channel._brpop_read = _brpop_read

    @signals.task_received.connect(weak=False)
    def received(request=None, **kwargs):
        now = time.time()
        marks.rpush(
            MARKS,
            f"readable {request.id} {readable[0]}",
            f"received {request.id} {now}",
        )

    @signals.task_prerun.connect(weak=False)
    def started(task_id=None, **kwargs):
        now = time.time()
        marks.rpush(MARKS, f"started {task_id} {now}")

    profile_path = os.environ.get("HOP_PROFILE")
    if profile_path:
        # On by a signal from main() once the worker is warm, off and dumped
        # by another: the measured tasks only, not the worker's start.
        profile = cProfile.Profile(time.process_time)
        pid = os.getpid()

        def on(*_):
            profile.enable()

        def off(*_):
            if os.getpid() == pid:
                profile.disable()
                profile.dump_stats(profile_path)

        signal.signal(PROFILE_ON, on)
        signal.signal(PROFILE_OFF, off)
    app.worker_main(["worker", *argv])


def cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        found += [int(child) for child in text]
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=300)
    parser.add_argument("--gap", type=float, default=0.02)
    parser.add_argument("--profile")
    args, extra = parser.parse_known_args()
    extra = [a for a in extra if a != "--"]

    import redis
    from peers_gatehouse import production_env

    env = production_env(os.environ["DATABASE_URL"], os.environ["CELERY_BROKER_URL"])
    if args.profile:
        env["HOP_PROFILE"] = str(Path(args.profile).resolve())
    client = redis.Redis.from_url(env["CELERY_BROKER_URL"])
    client.flushdb()
    command = [
        sys.executable,
        __file__,
        "--worker-side",
        "--concurrency=2",
        "--loglevel=WARNING",
        "--hostname=hop@%h",
        *extra,
    ]
    started_at = time.monotonic()
    worker = subprocess.Popen(command, env=env, cwd=ROOT)
    os.environ.update(env)
    import django

    django.setup()
    from celery import current_app

    from runs import dispatch

    def send_and_wait(task_id: str) -> dict[str, float]:
        """Sends a task and waits for its start; its marks."""
        found: dict[str, float] = {"send": time.time()}
        task.apply_async(
            (str(uuid.uuid4()),),
            task_id=task_id,
            declare=[],
            argsrepr="()",
            kwargsrepr="{}",
        )
        found["sent"] = time.time()
        while "started" not in found:
            popped = client.blpop(MARKS, timeout=1)
            if popped is None:
                if worker.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("the worker did not start the task")
                continue
            kind, mark_id, at = popped[1].decode().split()
            if mark_id == task_id:
                found[kind] = float(at)
        return found

    task = current_app.tasks[dispatch.EXECUTE_RUN]
    try:
        deadline = time.monotonic() + 120
        for _ in range(10):  # warm: the pool processes up, connections made
            send_and_wait(str(uuid.uuid4()))
        ready = time.monotonic() - started_at
        time.sleep(1.0)
        pids = [worker.pid, *children(worker.pid)]
        # Idle: what the worker spends with nothing to do, over as long.
        span = args.n * (args.gap + 0.006)
        idle0 = [cpu(pid) for pid in pids]
        time.sleep(span)
        idle = [cpu(pid) - c for pid, c in zip(pids, idle0, strict=True)]
        if args.profile:
            worker.send_signal(PROFILE_ON)
        cpu0 = [cpu(pid) for pid in pids]
        t0 = time.monotonic()
        marks = []
        for _ in range(args.n):
            deadline = time.monotonic() + 30
            marks.append(send_and_wait(str(uuid.uuid4())))
            time.sleep(args.gap)
        wall = time.monotonic() - t0
        used = [cpu(pid) - c for pid, c in zip(pids, cpu0, strict=True)]
        if args.profile:
            worker.send_signal(PROFILE_OFF)
            time.sleep(1.0)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
    scale = wall / span

    def ms(values):
        values = sorted(values)
        return (
            f"p50 {statistics.median(values) * 1000:6.2f} ms"
            f"  p90 {values[int(len(values) * 0.9)] * 1000:6.2f} ms"
        )

    def step(a, b):
        return [m[b] - m[a] for m in marks]

    print(f"worker flags: {' '.join(extra) or '(none)'}; {args.n} tasks")
    print(f"  worker start -> warm      {ready:.2f} s")
    print(f"  send -> started           {ms(step('send', 'started'))}")
    print(f"    send -> readable        {ms(step('send', 'readable'))}")
    print(f"    readable -> received    {ms(step('readable', 'received'))}")
    print(f"    received -> started     {ms(step('received', 'started'))}")
    print(f"  the send (apply_async)    {ms(step('send', 'sent'))}")
    names = ["parent", *[f"pool {i}" for i in range(len(pids) - 1)]]
    for name, u, i in zip(names, used, idle, strict=True):
        print(
            f"  CPU {name:7s} {(u - i * scale) / args.n * 1000:5.2f} ms/task"
            f" (idle {i / span * 1000:5.2f} ms/s)"
        )
    if args.profile:
        stats = pstats.Stats(args.profile)
        stats.sort_stats("tottime").print_stats(25)
        stats.sort_stats("cumulative").print_stats(40)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker-side":
        worker_side(sys.argv[2:])
    else:
        main()
