"""The decision POST as the web process serves it, statement by statement.

In one process: production settings (the database pool on, the Redis cache
and broker), the ASGI application of config/asgi.py called directly (no
socket), and for each iteration a refund thread run in-process up to its
approval gate (runs.execution.execute), then decided. Every SQL statement
(psycopg, so the checkpointer's too), every Redis command, the commit and
its on-commit callbacks are listed in order with their wall and CPU
(time.process_time) time and the Python time before each; then the medians
over all iterations, per position.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/gh_NAME \
    CELERY_BROKER_URL=redis://127.0.0.1:6379/N python bench/decision_probe.py [-n 60]

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
    Class.name) while a decision is measured: inclusive wall and CPU."""
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


async def gated(secret: str, case: str) -> str:
    from asgiref.sync import sync_to_async

    from runs import execution

    status, _, _ = await call(
        "POST", "/api/v1/threads", secret, {"thread_id": case, "agent": "refund"}
    )
    assert status == 201, status
    status, run, _ = await call(
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
    await sync_to_async(execution.execute, thread_sensitive=False)(run["run_id"])
    from urllib.parse import urlencode

    query = urlencode({"thread_id": case, "status": "pending"})
    status, page, _ = await call("GET", f"/api/v1/approvals?{query}", secret)
    assert status == 200, page
    return page["results"][0]["id"]


def _ms(values) -> float:
    return statistics.median(values) * 1000


async def main(n: int, warm: int, show: bool, watched: list[str]) -> None:
    from asgiref.sync import sync_to_async

    tenant, secret = await sync_to_async(setup_tenant, thread_sensitive=False)()
    redis.Redis.from_url(BROKER).flushdb()
    instrument()
    watch(watched)
    wholes, cpus, pythons = [], [], []
    positions = defaultdict(list)
    stamp = int(time.time())
    for i in range(n + warm):
        approval_id = await gated(secret, f"p{stamp}-{i}")
        TL.items = []
        TL.on = True
        w0, c0 = time.perf_counter(), time.process_time()
        status, body, answered = await call(
            "POST",
            f"/api/v1/approvals/{approval_id}/decision",
            secret,
            {"approved": True, "reviewer": "probe"},
        )
        c1 = time.process_time()
        TL.on = False
        assert status == 200, body
        if i < warm:
            FUNCTIONS.clear()
            continue
        items = TL.items
        wholes.append(answered - w0)
        cpus.append(c1 - c0)
        calls = [it for it in items if not it[0].startswith("[")]
        pythons.append((c1 - c0) - sum(it[4] - it[3] for it in calls))
        previous = (w0, c0)
        for k, (label, a, b, ca, cb) in enumerate(items):
            key = (
                k,
                label.split(" ")[0] + " " + label[len(label.split(" ")[0]) + 1 :][:70],
            )
            positions[key].append(
                (a - previous[0], ca - previous[1], b - a, cb - ca, a - w0)
            )
            if not label.startswith("["):
                previous = (b, cb)
        positions[(len(items), "answered (last body byte sent)")].append(
            (answered - previous[0], 0.0, 0.0, 0.0, answered - w0)
        )
        if show and i == warm:
            for label, a, b, _ca, _cb in items:
                print(f"{(a - w0) * 1000:7.2f} {(b - a) * 1000:5.2f}w {label[:140]}")
        if i % 20 == 0:
            redis.Redis.from_url(BROKER).flushdb()
    print(f"\n{len(wholes)} decisions; medians, ms")
    print(
        f"request → answered (wall): {_ms(wholes):.2f}; request CPU {_ms(cpus):.2f} "
        f"(Python outside SQL/Redis calls {_ms(pythons):.2f})"
    )
    print(" pos    at  gap(w/cpu)   call(w/cpu)  what")
    for key in sorted(positions):
        values = positions[key]
        if len(values) < len(wholes) // 2:
            continue
        gw, gc, cw, cc, at = (_ms([v[j] for v in values]) for j in range(5))
        print(
            f"{key[0]:4d} {at:6.2f} {gw:5.2f}/{gc:5.2f} {cw:6.2f}/{cc:5.2f}  {key[1]}"
        )
    for name, values in FUNCTIONS.items():
        print(
            f"  {name}: {len(values) / len(wholes):.0f} call(s) per decision, each "
            f"wall {_ms([v[0] for v in values]):.3f} cpu {_ms([v[1] for v in values]):.3f}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=60)
    parser.add_argument("--warm", type=int, default=5)
    parser.add_argument("--show", action="store_true")
    parser.add_argument(
        "--watch", action="append", default=[], help="module:qualname, timed per call"
    )
    args = parser.parse_args()
    asyncio.run(main(args.n, args.warm, args.show, args.watch))
