"""A request of the benchmark's flow as the web process serves it, statement
by statement: by default the decision POST; `create-thread`, `start-run`,
`protocol-start-run` (the same through /langgraph/), `find-approval` (the approvals list filtered to the thread) and `wait-run`
(the run's GET with `?wait=`) too.

In one process: production settings (the database pool on, the Redis cache
and broker), the ASGI application of config/asgi.py called directly (no
socket), and for each iteration what the request needs made first (a
thread; a run queued; a refund thread run in-process up to its approval gate,
runs.execution.execute), then the request. Every SQL statement
(psycopg, so the checkpointer's too), every Redis command, the commit and
its on-commit callbacks are listed in order with their wall and CPU
(time.process_time) time and the Python time before each; then the medians
over all iterations, per position. `wait-run` executes the queued run while
the request waits (runs.streaming.stopped): the wait is one line, left out of
the request's wall and CPU.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/gh_NAME \
    CELERY_BROKER_URL=redis://127.0.0.1:6379/N \
    python bench/decision_probe.py [REQUEST] [-n 60]

Migrates the database it is given; leaves its rows there. The broker's
messages are never consumed (no worker): it flushes that Redis database.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BROKER = os.environ["CELERY_BROKER_URL"]
os.environ.update(
    {
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "CACHE_URL": BROKER.replace("redis://", "rediscache://", 1),
        "SECRET_KEY": "probe",
        "DEBUG": "false",
        "GATEHOUSE_MASTER_KEYS": "bench:QkVOQ0hNQVJLLUtFWS0zMi1CWVRFUy1MT05HLi4uLi4=",
        "GATEHOUSE_AUDIT_KEYS": "bench-audit:QkVOQ0hNQVJLLUFVRElULUtFWS0zMi1CWVRFUy0uLiE=",
        "GATEHOUSE_THROTTLE_RATE": "1000000/minute",
        "ALLOWED_HOSTS": "127.0.0.1",
        "SECURE_SSL_REDIRECT": "false",
        "LOG_LEVEL": "WARNING",
    }
)

import psycopg  # noqa: E402
import redis.connection  # noqa: E402

from config.asgi import application  # noqa: E402  (django.setup())


class Timeline:
    def __init__(self) -> None:
        self.on = False
        self.items: list[tuple] = []  # (label, wall0, wall1, cpu0, cpu1)

    def mark(self, label, w0, c0) -> None:
        if self.on:
            self.items.append((label, w0, time.perf_counter(), c0, time.process_time()))


TL = Timeline()


def _timed(label_of):
    def decorate(original):
        def wrapper(*args, **kwargs):
            w0, c0 = time.perf_counter(), time.process_time()
            try:
                return original(*args, **kwargs)
            finally:
                TL.mark(label_of(*args, **kwargs), w0, c0)

        return wrapper

    return decorate


def _sql_label(cursor, query, params=None, **kwargs) -> str:
    text = query if isinstance(query, str) else str(query)
    return "SQL " + " ".join(text.split())[:110]


def _redis_label(connection, command, check_health=True) -> str:
    raw = (
        command
        if isinstance(command, bytes | bytearray)
        else b"".join(bytes(part) for part in command)
    )
    words = [
        part.decode(errors="replace")[:40]
        for part in raw.split(b"\r\n")
        if part and part[:1] not in (b"*", b"$")
    ]
    return "REDIS " + " ".join(words[:2])


def instrument() -> None:
    from django.db.backends.base.base import BaseDatabaseWrapper

    psycopg.Cursor.execute = _timed(_sql_label)(psycopg.Cursor.execute)
    conn = redis.connection.AbstractConnection
    conn.send_packed_command = _timed(_redis_label)(conn.send_packed_command)
    conn.read_response = _timed(lambda *a, **k: "REDIS (reply)")(conn.read_response)
    BaseDatabaseWrapper._commit = _timed(lambda *a: "COMMIT")(
        BaseDatabaseWrapper._commit
    )
    hooks = BaseDatabaseWrapper.run_and_clear_commit_hooks
    BaseDatabaseWrapper.run_and_clear_commit_hooks = _timed(
        lambda *a: "[on-commit callbacks, whole]"
    )(hooks)
    # pool checkout and return
    from psycopg_pool import ConnectionPool

    ConnectionPool.getconn = _timed(lambda *a, **k: "POOL getconn")(
        ConnectionPool.getconn
    )
    ConnectionPool.putconn = _timed(lambda *a, **k: "POOL putconn")(
        ConnectionPool.putconn
    )


FUNCTIONS: dict[str, list[tuple[float, float]]] = defaultdict(list)


def watch(names: list[str]) -> None:
    """Time each call of the functions named "module:qualname" (a method as
    Class.name) while a request is measured: inclusive wall and CPU."""
    import importlib

    for name in names:
        module_name, _, qualname = name.partition(":")
        owner = importlib.import_module(module_name)
        *path, attr = qualname.split(".")
        for part in path:
            owner = getattr(owner, part)
        original = getattr(owner, attr)

        def timed(*args, _original=original, _name=qualname, **kwargs):
            w0, c0 = time.perf_counter(), time.process_time()
            try:
                return _original(*args, **kwargs)
            finally:
                if TL.on:
                    FUNCTIONS[_name].append(
                        (time.perf_counter() - w0, time.process_time() - c0)
                    )

        setattr(owner, attr, timed)
        # and wherever it was imported by name
        for module in list(sys.modules.values()):
            if getattr(module, "__dict__", {}).get(attr) is original:
                setattr(module, attr, timed)


class Profiled:
    """cProfile (CPU time) of the request's synchronous part (what Django and
    DRF run in asgiref's threads), and apart of the event loop's part."""

    def __init__(self) -> None:
        import cProfile

        self.profile = cProfile.Profile(time.thread_time)
        self.loop = cProfile.Profile(time.thread_time)
        self.installed = False

    def install(self) -> None:
        from asgiref.sync import SyncToAsync

        original = SyncToAsync.thread_handler
        profile = self.profile

        def thread_handler(*args, **kwargs):
            if not TL.on:
                return original(*args, **kwargs)
            profile.enable()
            try:
                return original(*args, **kwargs)
            finally:
                profile.disable()

        SyncToAsync.thread_handler = thread_handler
        self.installed = True

    def report(self, lines: int = 45, callers: list[str] = ()) -> None:
        import pstats

        for title, profile in (("event loop", self.loop), ("sync", self.profile)):
            print(f"\n=== {title} ===")
            stats = pstats.Stats(profile).strip_dirs()
            stats.sort_stats("cumulative").print_stats(lines)
            stats.sort_stats("tottime").print_stats(lines)
            for name in callers:
                stats.print_callers(name)


async def call(method: str, path: str, secret: str, body=None):
    """One request through the ASGI application; (status, body, time sent)."""
    payload = json.dumps(body).encode() if body is not None else b""
    path, _, query = path.partition("?")
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "headers": [
            (b"host", b"127.0.0.1"),
            (b"authorization", f"Bearer {secret}".encode()),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(payload)).encode()),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }
    sent = False
    never = asyncio.Event()

    async def receive():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": payload, "more_body": False}
        await never.wait()
        return {"type": "http.disconnect"}

    out = {"body": b"", "status": None, "answered": None}

    async def send(message):
        if message["type"] == "http.response.start":
            out["status"] = message["status"]
        elif message["type"] == "http.response.body":
            out["body"] += message.get("body", b"")
            if not message.get("more_body"):
                out["answered"] = time.perf_counter()

    await application(scope, receive, send)
    return out["status"], json.loads(out["body"] or b"null"), out["answered"]


def setup_tenant():
    from django.core.management import call_command

    from audit.services import Actor
    from runs import services

    call_command("migrate", verbosity=0)
    slug = f"probe-{int(time.time())}"
    tenant = services.tenant_create(slug=slug, name=slug, actor=Actor.system("probe"))
    issued = services.api_key_create(
        tenant=tenant,
        name="probe",
        scopes=["runs", "approvals"],
        actor=Actor.system("probe"),
    )
    return tenant, issued.secret


INPUT = {
    "customer_message": "My blender arrived damaged, please refund me.",
    "order": {"id": "A-1", "amount": "40.00", "currency": "EUR"},
}


async def _ok(expected: int, method: str, path: str, secret: str, body=None):
    status, answer, _ = await call(method, path, secret, body)
    assert status == expected, (method, path, status, answer)
    return answer


async def _thread(secret: str, case: str) -> None:
    body = {"thread_id": case, "agent": "refund"}
    await _ok(201, "POST", "/api/v1/threads", secret, body)


async def _started(secret: str, case: str) -> str:
    await _thread(secret, case)
    path = f"/api/v1/threads/{case}/runs"
    return (await _ok(202, "POST", path, secret, {"input": INPUT}))["run_id"]


async def _execute(run_id: str) -> None:
    from asgiref.sync import sync_to_async

    from runs import execution

    await sync_to_async(execution.execute, thread_sensitive=False)(run_id)


def _approvals_path(case: str) -> str:
    from urllib.parse import urlencode

    query = urlencode({"thread_id": case, "status": "pending"})
    return f"/api/v1/approvals?{query}"


async def _gated(secret: str, case: str) -> str:
    """A refund thread run to its approval gate: the request's id."""
    await _execute(await _started(secret, case))
    page = await _ok(200, "GET", _approvals_path(case), secret)
    return page["results"][0]["id"]


# The requests of the benchmark's flow (bench/peers_gatehouse.py), each as
# what it needs made first and the request itself: (method, path, body,
# expected status).
async def _create_thread(secret: str, case: str):
    return "POST", "/api/v1/threads", {"thread_id": case, "agent": "refund"}, 201


async def _start_run(secret: str, case: str):
    await _thread(secret, case)
    return "POST", f"/api/v1/threads/{case}/runs", {"input": INPUT}, 202


async def _protocol_start_run(secret: str, case: str):
    """The Agent Protocol's run start (langgraph-sdk's runs.create)."""
    await _thread(secret, case)
    body = {"assistant_id": "refund", "input": INPUT}
    return "POST", f"/langgraph/threads/{case}/runs", body, 200


async def _find_approval(secret: str, case: str):
    await _execute(await _started(secret, case))
    return "GET", _approvals_path(case), None, 200


async def _wait_run(secret: str, case: str):
    """The run's GET with `?wait=` on a queued run, executed in-process while
    the request waits (the wait excluded from the figures: see waited)."""
    run_id = await _started(secret, case)
    WAIT.run_id = run_id
    return "GET", f"/api/v1/threads/{case}/runs/{run_id}?wait=10", None, 200


async def _decision(secret: str, case: str):
    approval_id = await _gated(secret, case)
    body = {"approved": True, "reviewer": "probe"}
    return "POST", f"/api/v1/approvals/{approval_id}/decision", body, 200


REQUESTS = {
    "create-thread": _create_thread,
    "start-run": _start_run,
    "protocol-start-run": _protocol_start_run,
    "find-approval": _find_approval,
    "wait-run": _wait_run,
    "decision": _decision,
}


class Wait:
    """The wait of a run's GET (runs.streaming.stopped), during which the run
    executes in this process: left out of the timeline and of the request's
    CPU; the request goes on once the execution is over."""

    run_id: str | None = None
    wall = cpu = 0.0

    def install(self) -> None:
        from runs import streaming

        original = streaming.stopped

        async def waited(*args, **kwargs):
            on, TL.on = TL.on, False
            w0, c0 = time.perf_counter(), time.process_time()
            waiting = asyncio.ensure_future(original(*args, **kwargs))
            await asyncio.sleep(0.005)  # subscribed before the run starts
            await _execute(self.run_id)
            ended = await waiting
            self.wall += time.perf_counter() - w0
            self.cpu += time.process_time() - c0
            TL.on = on
            TL.mark("WAIT (the run executed meanwhile: left out)", w0, c0)
            return ended

        streaming.stopped = waited


WAIT = Wait()
PROFILE_CALLERS = [c for c in os.environ.get("PROBE_CALLERS", "").split(",") if c]


def _ms(values) -> float:
    return statistics.median(values) * 1000


async def main(
    request: str, n: int, warm: int, show: bool, watched: list[str], profile: bool
) -> None:
    from asgiref.sync import sync_to_async

    tenant, secret = await sync_to_async(setup_tenant, thread_sensitive=False)()
    redis.Redis.from_url(BROKER).flushdb()
    instrument()
    watch(watched)
    WAIT.install()
    profiled = Profiled() if profile else None
    prepare = REQUESTS[request]
    wholes, cpus, pythons = [], [], []
    positions = defaultdict(list)
    stamp = int(time.time())
    for i in range(n + warm):
        method, path, payload, expected = await prepare(secret, f"p{stamp}-{i}")
        TL.items = []
        TL.on = True
        WAIT.wall = WAIT.cpu = 0.0
        if profiled is not None and profiled.installed:
            profiled.loop.enable()
        w0, c0 = time.perf_counter(), time.process_time()
        status, body, answered = await call(method, path, secret, payload)
        c1 = time.process_time()
        if profiled is not None:
            profiled.loop.disable()
        TL.on = False
        assert status == expected, (status, body)
        if i < warm:
            FUNCTIONS.clear()
            continue
        if profiled is not None and i == warm:
            profiled.install()
        items = TL.items
        wholes.append(answered - w0 - WAIT.wall)
        cpus.append(c1 - c0 - WAIT.cpu)
        calls = [it for it in items if not it[0].startswith("[")]
        pythons.append((c1 - c0) - sum(it[4] - it[3] for it in calls))
        previous = (w0, c0)
        for k, (label, a, b, ca, cb) in enumerate(items):
            key = (
                k,
                label.split(" ")[0] + " " + label[len(label.split(" ")[0]) + 1 :][:70],
            )
            positions[key].append(
                (a - previous[0], ca - previous[1], b - a, cb - ca, a - w0, ca - c0)
            )
            if not label.startswith("["):
                previous = (b, cb)
        positions[(len(items), "answered (last body byte sent)")].append(
            (answered - previous[0], 0.0, 0.0, 0.0, answered - w0, c1 - c0)
        )
        if show and i == warm:
            for label, a, b, _ca, _cb in items:
                print(f"{(a - w0) * 1000:7.2f} {(b - a) * 1000:5.2f}w {label[:140]}")
        if i % 20 == 0:
            redis.Redis.from_url(BROKER).flushdb()
    print(f"\n{len(wholes)} × {request}; medians, ms (a wait left out)")
    print(
        f"request → answered (wall): {_ms(wholes):.2f}; request CPU {_ms(cpus):.2f} "
        f"(mean {statistics.mean(cpus) * 1000:.2f}) "
        f"(Python outside SQL/Redis calls {_ms(pythons):.2f})"
    )
    print(" pos    at cpu-at  gap(w/cpu)   call(w/cpu)  what")
    for key in sorted(positions):
        values = positions[key]
        if len(values) < len(wholes) // 2:
            continue
        gw, gc, cw, cc, at, cpu_at = (_ms([v[j] for v in values]) for j in range(6))
        print(
            f"{key[0]:4d} {at:6.2f} {cpu_at:6.2f} {gw:5.2f}/{gc:5.2f} "
            f"{cw:6.2f}/{cc:5.2f}  {key[1]}"
        )
    if profiled is not None:
        profiled.report(callers=PROFILE_CALLERS)
    for name, values in FUNCTIONS.items():
        print(
            f"  {name}: {len(values) / len(wholes):.0f} call(s) per request, each "
            f"wall {_ms([v[0] for v in values]):.3f} cpu {_ms([v[1] for v in values]):.3f}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("request", nargs="?", default="decision", choices=REQUESTS)
    parser.add_argument("-n", type=int, default=60)
    parser.add_argument("--warm", type=int, default=5)
    parser.add_argument("--show", action="store_true")
    parser.add_argument(
        "--watch", action="append", default=[], help="module:qualname, timed per call"
    )
    parser.add_argument(
        "--profile", action="store_true", help="cProfile the requests' sync part"
    )
    args = parser.parse_args()
    asyncio.run(
        main(args.request, args.n, args.warm, args.show, args.watch, args.profile)
    )
