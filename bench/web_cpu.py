"""CPU of the web process per request, on the hot paths of both APIs.

Production mode (Postgres, Redis cache and broker, gunicorn with one uvicorn
worker per application served, one Celery worker process), flows one at a
time, so that what a web worker spends between two readings belongs to the
request in between:

- Agent Protocol (bench/stream.py's flow, over langgraph-sdk): create a
  thread, `runs.wait` to the input interrupt, then resume through `runs.wait`,
  `runs.create` + `runs.join` or `runs.stream`, in turns;
- REST (bench/peers_gatehouse.py's flow): create a thread, start the refund
  run, join it, status GET, find the approval, decide, join, status GET.

Several `--app`s (gunicorn's "module:app", optionally preceded by NAME=value
settings of that server's environment and gunicorn options, such as
--chdir=ANOTHER_CHECKOUT) are served side by side and their
flows interleaved: an A/B on a shared machine, where the load falls on both.
The web worker's CPU is /proc/PID/stat's user + system time, which keeps the
time of threads that ended; it counts in clock ticks (10 ms), so only means
over many requests say anything. `--profile FILE` records the first app's
worker with py-spy (raw format; PY_SPY names the binary) and prints the
functions with the most samples.

    python bench/web_cpu.py [--flows 60] [--redis-db 3] [--app A --app B]

Uses the database GATEHOUSE_BENCH_STREAM_DB (default gatehouse_bench_webcpu,
recreated) and Redis database `--redis-db` (flushed).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("GATEHOUSE_BENCH_STREAM_DB", "gatehouse_bench_webcpu")

import stream  # noqa: E402  (after the database name is set)


def web_worker_pid(master_pid: int) -> int:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        children = Path(f"/proc/{master_pid}/task/{master_pid}/children")
        pids = children.read_text().split()
        if pids:
            return int(pids[0])
        time.sleep(0.2)
    raise RuntimeError("no web worker")


def stat_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Meter:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.by_kind: dict[str, list[float]] = defaultdict(list)

    def call(self, kind: str, function, *args, **kwargs):
        before = stat_seconds(self.pid)
        result = function(*args, **kwargs)
        # What the worker does after answering (a stream's close, a commit
        # hook) lands in the next reading; flows are sequential, so a
        # request's tail is not lost, it is counted once, one request later.
        self.by_kind[kind].append(stat_seconds(self.pid) - before)
        return result


def agent_protocol_flow(client, meter: Meter, way: str) -> None:
    from stream import AGENT, RESUME

    thread_id = meter.call(
        "ap: create thread", client.threads.create, metadata={"graph_id": AGENT}
    )["thread_id"]
    output = meter.call(
        "ap: runs.wait start", client.runs.wait, thread_id, AGENT, input={}
    )
    assert output["__interrupt__"], output
    if way == "wait":
        output = meter.call(
            "ap: runs.wait resume", client.runs.wait, thread_id, AGENT, command=RESUME
        )
    elif way == "join":
        run = meter.call(
            "ap: runs.create resume",
            client.runs.create,
            thread_id,
            AGENT,
            command=RESUME,
        )
        output = meter.call("ap: runs.join", client.runs.join, thread_id, run["run_id"])
    else:
        events = meter.call(
            "ap: runs.stream resume",
            lambda: [
                part.event
                for part in client.runs.stream(
                    thread_id, AGENT, command=RESUME, stream_mode="values"
                )
            ],
        )
        assert events[-1] == "end", events
        return
    assert output == {"answer": "order A-1"}, output


# How the REST flow waits for a run to stop (--rest-waiter): the Agent
# Protocol's join, then a status GET; or the run's long poll (GET ?wait=),
# as bench/peers.py's Gatehouse client does by default.
REST_WAITER = "join"


def joined(rest, meter: Meter, thread_id: str, run_id: str, wanted: str) -> None:
    """Wait for the run's end (join), then read how it stopped (status GET);
    or, with the `wait` waiter, both in one long poll."""
    if REST_WAITER == "wait":
        run = meter.call(
            "rest: wait GET",
            rest.request,
            "GET",
            f"/api/v1/threads/{thread_id}/runs/{run_id}?wait=30",
        )
        assert run["status"] == wanted, run
        return
    meter.call(
        "rest: join",
        rest.request,
        "GET",
        f"/langgraph/threads/{thread_id}/runs/{run_id}/join",
    )
    run = meter.call(
        "rest: status GET",
        rest.request,
        "GET",
        f"/api/v1/threads/{thread_id}/runs/{run_id}",
    )
    assert run["status"] == wanted, run


def rest_flow(rest, meter: Meter, case) -> None:
    from urllib.parse import urlencode

    from peers_common import refund_request

    thread_id = f"webcpu-{case}"
    meter.call(
        "rest: create thread",
        rest.request,
        "POST",
        "/api/v1/threads",
        {"thread_id": thread_id, "agent": "refund"},
    )
    run_id = meter.call(
        "rest: start run",
        rest.request,
        "POST",
        f"/api/v1/threads/{thread_id}/runs",
        {"input": refund_request(case)},
    )["run_id"]
    joined(rest, meter, thread_id, run_id, "interrupted")
    query = urlencode({"thread_id": thread_id, "status": "pending"})
    approval_id = meter.call(
        "rest: find approval", rest.request, "GET", f"/api/v1/approvals?{query}"
    )["results"][0]["id"]
    resumed = meter.call(
        "rest: decision",
        rest.request,
        "POST",
        f"/api/v1/approvals/{approval_id}/decision",
        {"approved": True, "reviewer": "bench"},
    )["resumed_run"]["run_id"]
    joined(rest, meter, thread_id, resumed, "succeeded")


def top_functions(raw: Path, count: int = 40) -> str:
    """py-spy's raw (collapsed) stacks: self and inclusive samples by function."""
    own: Counter = Counter()
    inclusive: Counter = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, samples = line.rpartition(" ")
        if not stack:
            continue
        samples = int(samples)
        total += samples
        frames = [
            frame.split(" (")[0] + " " + frame.rsplit("/", 1)[-1].split(":")[0]
            for frame in stack.split(";")
        ]
        own[frames[-1]] += samples
        for frame in set(frames):
            inclusive[frame] += samples
    lines = [f"{total} samples", "self:"]
    lines += [f"  {n / total:6.1%} {f}" for f, n in own.most_common(count)]
    lines.append("inclusive:")
    lines += [f"  {n / total:6.1%} {f}" for f, n in inclusive.most_common(count * 2)]
    return "\n".join(lines)


def start_platform(apps: list[str]) -> tuple[list[str], list]:
    """A web server (gunicorn, one uvicorn worker) per application, and one
    Celery worker process (prefork, concurrency 1) serving them all."""
    ports = [stream.free_port() for _ in apps]
    processes = []
    for index, (spec, port) in enumerate(zip(apps, ports, strict=True)):
        # "NAME=value ... --option ... module:app": this one server's
        # environment and gunicorn options (--chdir: another checkout's code).
        *settings, app = spec.split()
        options = [s for s in settings if s.startswith("--")]
        settings = [s for s in settings if not s.startswith("--")]
        log = open(f"/tmp/gatehouse-webcpu-web{index}.log", "w")  # noqa: SIM115
        processes.append(
            subprocess.Popen(
                [
                    *(sys.executable, "-m", "gunicorn", app),
                    *("--worker-class", "uvicorn_worker.UvicornWorker"),
                    *("--workers", "1", "--bind", f"127.0.0.1:{port}"),
                    *("--keep-alive", "75"),
                    *options,
                ],
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **dict(s.split("=", 1) for s in settings)},
                start_new_session=True,
            )
        )
    processes.append(
        stream.start(
            [
                *(sys.executable, "-m", "celery", "-A", "config", "worker"),
                *("--pool=prefork", "--concurrency=1", "--loglevel=WARNING"),
                *("--hostname=webcpu@%h", "--without-gossip", "--without-mingle"),
                "--without-heartbeat",
            ],
            "webcpu-worker",
        )
    )
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    stream.wait_until_up(urls)
    return urls, processes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--flows", type=int, default=60)
    parser.add_argument("--redis-db", type=int, default=3)
    parser.add_argument(
        "--app",
        action="append",
        help="the ASGI application to serve (gunicorn's syntax); several: "
        "compared in the same run, their flows interleaved",
    )
    parser.add_argument("--profile", type=Path, help="py-spy of the first app")
    parser.add_argument("--only", choices=["ap", "rest"])
    parser.add_argument(
        "--rest-waiter",
        choices=["join", "wait"],
        default="join",
        help="how the REST flow waits for a run: the Agent Protocol's join and "
        "a status GET, or the run's long poll (GET ?wait=)",
    )
    args = parser.parse_args()
    global REST_WAITER
    REST_WAITER = args.rest_waiter
    apps = args.app or ["config.asgi:application"]
    import logging

    logging.getLogger("httpx").setLevel(logging.WARNING)
    stream.configure(args.redis_db)
    os.environ["CACHE_URL"] = f"rediscache://127.0.0.1:6379/{args.redis_db}"
    # What config.asgi sets, for an application given otherwise.
    os.environ["DATABASE_POOL"] = "true"
    stream.recreate_database()
    import redis

    redis.Redis.from_url(os.environ["CELERY_BROKER_URL"]).flushdb()
    key = stream.api_key(scopes=["runs", "approvals"])
    urls, processes = start_platform(apps)
    try:
        from peers_gatehouse import GatehouseClient

        pids = [web_worker_pid(process.pid) for process in processes[: len(apps)]]
        clients = [stream.client_for(url, key) for url in urls]
        rests = [
            GatehouseClient(url, key, waiter="join", interval=0.05) for url in urls
        ]
        for index, pid in enumerate(pids):
            warm = Meter(pid)
            for case in range(5):
                agent_protocol_flow(
                    clients[index], warm, ("wait", "join", "stream")[case % 3]
                )
                rest_flow(rests[index], warm, f"warm-{index}-{case}")
        spy = None
        if args.profile:
            spy = subprocess.Popen(
                [
                    os.environ.get("PY_SPY", str(ROOT / ".venv/bin/py-spy")),
                    *("record", "--gil", "-r", "200", "--format", "raw"),
                    *("-o", str(args.profile), "--pid", str(pids[0])),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(1)
        meters = [Meter(pid) for pid in pids]
        flows = [{"ap": 0.0, "rest": 0.0} for _ in apps]
        stat_start = [stat_seconds(pid) for pid in pids]
        for case in range(args.flows):
            for index, pid in enumerate(pids):
                if args.only != "rest":
                    before = stat_seconds(pid)
                    agent_protocol_flow(
                        clients[index],
                        meters[index],
                        ("wait", "join", "stream")[case % 3],
                    )
                    flows[index]["ap"] += stat_seconds(pid) - before
                if args.only != "ap":
                    before = stat_seconds(pid)
                    rest_flow(rests[index], meters[index], f"{index}-{case}")
                    flows[index]["rest"] += stat_seconds(pid) - before
        stat_total = [
            stat_seconds(pid) - s for pid, s in zip(pids, stat_start, strict=True)
        ]
        if spy is not None:
            spy.send_signal(2)
            spy.wait(timeout=60)
    finally:
        stream.stop(processes)
    print(
        f"web worker CPU (ms), {args.flows} flows of each kind per app, "
        f"interleaved (load {stream.load()}):"
    )
    print(f"{'':28} " + " ".join(f"{'app ' + str(i):>9}" for i in range(len(apps))))
    for name in ("ap", "rest"):
        print(
            f"{name + ' flow':28} "
            + " ".join(f"{f[name] / args.flows * 1000:9.1f}" for f in flows)
        )
    print(
        f"{'all, per flow pair':28} "
        + " ".join(f"{t / args.flows * 1000:9.1f}" for t in stat_total)
    )
    for kind in sorted(meters[0].by_kind):
        values = [m.by_kind.get(kind, [0.0]) for m in meters]
        print(
            f"{kind:24} {len(values[0]):3} "
            + " ".join(f"{statistics.mean(v) * 1000:9.2f}" for v in values)
        )
    for index, app in enumerate(apps):
        print(f"app {index}: {app}")
    if args.profile and args.profile.exists():
        print(top_functions(args.profile))


if __name__ == "__main__":
    main()
