"""Checkpoint store benchmark: DjangoSaver beside LangGraph's PostgresSaver.

    make bench-checkpoints            # or: python bench/checkpoints.py --help

Runs against one Postgres (DATABASE_URL names the server; the benchmark works
in its own database, `<name>_bench`, created and dropped here), side by side:

- `PostgresSaver`, plain and with `EncryptedSerializer` (AES-EAX, pycryptodome);
- `DjangoSaver`;
- a floor: raw psycopg inserts of the bytes DjangoSaver stores (checkpoint,
  blob and write rows, one transaction per put and per put_writes), with no
  serialisation, no encryption and no ORM.

Workload: threads whose state is a growing list of chat messages of about 500
bytes each plus a few scalars, 200 steps per thread, each step a `put` (with
only the changed channels in `new_versions`) and a `put_writes` of the step's
two writes. Reported: writes per second (puts + put_writes, median of the
rounds), `get_tuple` latency for the latest checkpoint of a thread with 10,000
checkpoints, and bytes in the database per checkpoint of a 200-step thread.
Results go to the "Checkpoint store" section of docs/benchmarks.md
(`bench/benchmarks_doc.py` keeps the other sections).
"""

from __future__ import annotations

import argparse
import base64
import os
import platform
import random
import statistics
import sys
import time
import uuid
from contextlib import ExitStack
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# Issue 15: a 200-step chat thread stores under 0.2 MB, counted as what one
# more thread adds to a store already holding one (chat_sizes; CHAT_METHOD).
CHAT_TARGET_BYTES = 200_000
# Said wherever the chat figure is printed or judged: the method changed at
# b12474b, and with it the figure, with no change of format.
CHAT_METHOD = (
    "Method: since b12474b the chat figure is what threads add to a store that "
    "already holds one, per thread; before, it was measured from emptied "
    "tables and held what a table pays once (DjangoSaver DeltaChannel 0.249 MB "
    "at f6ae369 that way, 0.211-0.213 MB at b12474b this way, no format "
    "changed). Judge issue 15's 0.2 MB goal and the storage work's cuts from "
    "0.211-0.213 MB, not from the figures before b12474b."
)
SAVERS = ("PostgresSaver", "PostgresSaver+EncryptedSerializer", "DjangoSaver", "floor")
WORDS = (
    "refund order invoice customer account shipping delivered package damaged "
    "please could you check the status of my request thanks again we have "
    "processed your payment within three business days policy exception agent "
    "reviewed approved denied escalated ticket number reference update address"
).split()


# --- setup -----------------------------------------------------------------------


def _bench_url(server_url: str) -> tuple[str, str]:
    parts = urlsplit(server_url)
    name = parts.path.lstrip("/") or "postgres"
    bench = f"{name}_bench"
    return bench, urlunsplit(parts._replace(path=f"/{bench}"))


def _admin_url(server_url: str) -> str:
    return urlunsplit(urlsplit(server_url)._replace(path="/postgres"))


def _create_database(server_url: str, name: str) -> None:
    import psycopg

    with psycopg.connect(_admin_url(server_url), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def _drop_database(server_url: str, name: str) -> None:
    import psycopg

    with psycopg.connect(_admin_url(server_url), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _setup_django(bench_url: str) -> None:
    os.environ["DATABASE_URL"] = bench_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("SECRET_KEY", "benchmark-only-secret-key")
    os.environ.setdefault(
        "GATEHOUSE_MASTER_KEYS",
        "bench:" + base64.b64encode(os.urandom(32)).decode(),
    )
    os.environ.setdefault(
        "GATEHOUSE_AUDIT_KEYS",
        "bench-audit:" + base64.b64encode(os.urandom(32)).decode(),
    )
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    os.environ.setdefault("ALLOWED_HOSTS", "localhost")
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def _with_search_path(url: str, schema: str) -> str:
    parts = urlsplit(url)
    query = f"{parts.query}&" if parts.query else ""
    return urlunsplit(parts._replace(query=f"{query}options=-csearch_path%3D{schema}"))


# --- workload ----------------------------------------------------------------------


def _message(rng: random.Random, step: int) -> dict:
    words, length = [], 0
    while length < 470:
        word = rng.choice(WORDS)
        words.append(word)
        length += len(word) + 1
    return {
        "role": "user" if step % 2 else "assistant",
        "id": f"msg-{step}",
        "content": " ".join(words),
    }


class Workload:
    """The checkpoints, versions and writes of one thread, step by step.

    Steps are built before they are timed: only the store's work is measured.
    """

    def __init__(self, saver, thread_id: str, *, window: int | None = None) -> None:
        self.saver = saver
        self.thread_id = thread_id
        self.window = window
        self.rng = random.Random(thread_id)
        self.messages: list[dict] = []
        self.versions: dict[str, str] = {}
        self.parent_id: str | None = None
        self.step = 0

    def next_step(self):
        from langgraph.checkpoint.base import empty_checkpoint

        message = _message(self.rng, self.step)
        self.messages = [*self.messages, message]
        if self.window:
            self.messages = self.messages[-self.window :]
        values = {
            "messages": self.messages,
            "step": self.step,
            "tokens": self.step * 137,
            "status": "active",
        }
        changed = ["messages", "step", "tokens"] + (["status"] if not self.step else [])
        new_versions = {}
        for channel in changed:
            new_versions[channel] = self.saver.get_next_version(
                self.versions.get(channel), None
            )
        self.versions.update(new_versions)
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = values
        checkpoint["channel_versions"] = dict(self.versions)
        checkpoint["versions_seen"] = {"agent": dict(self.versions)}
        config = {"configurable": {"thread_id": self.thread_id, "checkpoint_ns": ""}}
        if self.parent_id:
            config["configurable"]["checkpoint_id"] = self.parent_id
        self.parent_id = checkpoint["id"]
        metadata = {"source": "loop", "step": self.step, "parents": {}}
        writes = [("messages", [message]), ("tokens", self.step * 137)]
        self.step += 1
        return config, checkpoint, metadata, new_versions, writes

    def prepare(self, steps: int) -> list[tuple]:
        return [(*self.next_step(), str(uuid.uuid4())) for _ in range(steps)]

    def run(self, steps: int) -> tuple[int, float]:
        """Puts and put_writes for `steps` steps: (calls, seconds in the store)."""
        return steps * 2, run_steps(self.saver, self.prepare(steps))


def run_steps(saver, steps: list[tuple]) -> float:
    """Seconds the store takes to put the prepared steps and their writes."""
    started = time.perf_counter()
    for config, checkpoint, metadata, new_versions, writes, task_id in steps:
        stored = saver.put(config, checkpoint, metadata, new_versions)
        saver.put_writes(stored, writes, task_id)
    return time.perf_counter() - started


# --- the floor: raw inserts of DjangoSaver's bytes ---------------------------------

FLOOR_DDL = """
CREATE TABLE IF NOT EXISTS floor_checkpoints (
    thread_id TEXT NOT NULL, checkpoint_ns TEXT NOT NULL, checkpoint_id TEXT NOT NULL,
    parent_checkpoint_id TEXT, checkpoint BYTEA NOT NULL, metadata BYTEA NOT NULL,
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id));
CREATE TABLE IF NOT EXISTS floor_blobs (
    thread_id TEXT NOT NULL, checkpoint_ns TEXT NOT NULL, channel TEXT NOT NULL,
    version TEXT NOT NULL, blob BYTEA NOT NULL,
    PRIMARY KEY (thread_id, checkpoint_ns, channel, version));
CREATE TABLE IF NOT EXISTS floor_writes (
    thread_id TEXT NOT NULL, checkpoint_ns TEXT NOT NULL, checkpoint_id TEXT NOT NULL,
    task_id TEXT NOT NULL, idx INTEGER NOT NULL, channel TEXT NOT NULL,
    blob BYTEA NOT NULL,
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, task_id, idx));
"""


class FloorSaver:
    """Stores precomputed bytes with plain INSERTs; the cost of the rows alone."""

    def __init__(self, conn, encoder) -> None:
        self.conn = conn
        self.encoder = encoder  # DjangoSaver's encryption, applied before timing
        self.encode_seconds = 0.0

    def get_next_version(self, current, channel):
        from runs.checkpointer import VersionSequence

        if not hasattr(self, "versions"):
            self.versions = VersionSequence()  # DjangoSaver's, the same bytes
        return self.versions.after(current)

    def prepare(self, workload: Workload, steps: int) -> list[tuple]:
        """Encrypt every step as DjangoSaver would, outside the timed part."""
        pending = []
        for _ in range(steps):
            config, checkpoint, metadata, new_versions, writes = workload.next_step()
            started = time.perf_counter()
            pending.append(
                self.encoder(config, checkpoint, metadata, new_versions, writes)
            )
            self.encode_seconds += time.perf_counter() - started
        return pending

    def run(self, pending: list[tuple]) -> float:
        """Seconds to insert the prepared rows, a transaction per put and writes."""
        started = time.perf_counter()
        with self.conn.cursor() as cur:
            for checkpoint_row, blob_rows, write_rows in pending:
                with self.conn.transaction():
                    cur.executemany(
                        "INSERT INTO floor_blobs VALUES (%s, %s, %s, %s, %s) "
                        "ON CONFLICT DO NOTHING",
                        blob_rows,
                    )
                    cur.execute(
                        "INSERT INTO floor_checkpoints VALUES (%s, %s, %s, %s, %s, %s) "
                        "ON CONFLICT DO NOTHING",
                        checkpoint_row,
                    )
                with self.conn.transaction():
                    cur.executemany(
                        "INSERT INTO floor_writes VALUES (%s, %s, %s, %s, %s, %s, %s) "
                        "ON CONFLICT DO NOTHING",
                        write_rows,
                    )
        return time.perf_counter() - started


def _django_encoder(tenant, thread_id: str):
    """A function producing the rows DjangoSaver would write for one step."""
    from runs.checkpointer import _is_inline
    from runs.crypto import ThreadCipher
    from runs.models import Thread

    thread = Thread.objects.create_with_data_key(tenant=tenant, thread_id=thread_id)
    cipher = ThreadCipher.for_thread(thread)

    def encode(config, checkpoint, metadata, new_versions, writes):
        cid = checkpoint["id"]
        values = checkpoint["channel_values"]
        inline = {k: v for k, v in values.items() if _is_inline(v)}
        body = {
            k: v for k, v in checkpoint.items() if k not in ("id", "channel_values")
        }
        body["channel_values"] = inline
        body["blob_channels"] = sorted(set(values) - set(inline))
        blob_rows = [
            (
                thread_id,
                "",
                channel,
                version,
                cipher.encrypt_value(
                    values[channel], row=("blob", "", channel, version)
                ),
            )
            for channel, version in new_versions.items()
            if channel not in inline
        ]
        checkpoint_row = (
            thread_id,
            "",
            cid,
            config["configurable"].get("checkpoint_id"),
            cipher.encrypt_value(body, row=("checkpoint", "", cid)),
            cipher.encrypt_value(metadata, row=("metadata", "", cid)),
        )
        task_id = str(uuid.uuid4())
        write_rows = [
            (
                thread_id,
                "",
                cid,
                task_id,
                idx,
                channel,
                cipher.encrypt_value(value, row=("write", "", cid, task_id, idx)),
            )
            for idx, (channel, value) in enumerate(writes)
        ]
        return checkpoint_row, blob_rows, write_rows

    return encode


# --- a chat thread through a real graph ------------------------------------------

CHAT_STORES = (
    ("PostgresSaver", "list"),
    ("PostgresSaver+EncryptedSerializer", "list"),
    ("DjangoSaver", "list"),
    ("PostgresSaver", "DeltaChannel"),
    ("DjangoSaver", "DeltaChannel"),
)


def _append(state: list, writes: list) -> list:
    """The message list's reducer, batched as DeltaChannel calls it."""
    return [*state, *(message for write in writes for message in write)]


def _chat_states() -> dict[str, type]:
    """The chat's state, its messages in a plain list channel or a DeltaChannel."""
    import operator
    from typing import Annotated, TypedDict

    from langgraph.channels import DeltaChannel

    # Built here, not at import: the benchmark imports LangGraph after Django.
    return {
        "list": TypedDict("ListChat", {"messages": Annotated[list, operator.add]}),
        "DeltaChannel": TypedDict(
            "DeltaChat", {"messages": Annotated[list, DeltaChannel(_append)]}
        ),
    }


def chat_graph(saver, channel: str, steps: int, *, short: bool = False):
    """One node that adds one ~500-byte message (`short`: a few words) per
    super-step, `steps` times."""
    from langgraph.graph import END, START, StateGraph

    def speak(state: dict) -> dict:
        turn = len(state["messages"])
        if short:
            return {"messages": [{"role": "user", "content": f"message {turn}"}]}
        return {"messages": [_message(random.Random(turn), turn)]}

    builder = StateGraph(_chat_states()[channel])
    builder.add_node("speak", speak)
    builder.add_edge(START, "speak")
    builder.add_conditional_edges(
        "speak",
        lambda s: "speak" if len(s["messages"]) < steps else END,
        ["speak", END],
    )
    return builder.compile(checkpointer=saver)


# --- measurement -------------------------------------------------------------------


class Bench:
    def __init__(self, args, bench_url: str) -> None:
        self.args = args
        self.bench_url = bench_url
        self.stack = ExitStack()
        self.savers: dict[str, object] = {}
        self.conns: dict[str, object] = {}
        # DjangoSaver's work before the database, timed when preparing the floor.
        self.encode_seconds = 0.0
        self.encode_calls = 0

    def open(self) -> None:
        import psycopg
        from langgraph.checkpoint.postgres import PostgresSaver
        from langgraph.checkpoint.serde.encrypted import EncryptedSerializer

        from runs.checkpointer import DjangoSaver
        from runs.models import Tenant

        for schema in ("lg_plain", "lg_encrypted", "floor"):
            with psycopg.connect(self.bench_url, autocommit=True) as conn:
                conn.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
        for name, schema, serde in (
            ("PostgresSaver", "lg_plain", None),
            (
                "PostgresSaver+EncryptedSerializer",
                "lg_encrypted",
                EncryptedSerializer.from_pycryptodome_aes(key=os.urandom(32)),
            ),
        ):
            conn = self.stack.enter_context(
                psycopg.connect(
                    _with_search_path(self.bench_url, schema),
                    autocommit=True,
                    prepare_threshold=0,
                    row_factory=psycopg.rows.dict_row,
                )
            )
            saver = PostgresSaver(conn, serde=serde)
            saver.setup()
            self.savers[name] = saver
            self.conns[name] = conn
        floor_conn = self.stack.enter_context(
            psycopg.connect(_with_search_path(self.bench_url, "floor"), autocommit=True)
        )
        floor_conn.execute(FLOOR_DDL)
        self.conns["floor"] = floor_conn
        self.tenant = Tenant.objects.create(slug=f"bench-{uuid.uuid4().hex[:8]}")
        self.savers["DjangoSaver"] = DjangoSaver(tenant=self.tenant)

    def close(self) -> None:
        from django.db import connections

        connections.close_all()
        self.stack.close()

    def truncate(self) -> None:
        from django.db import connection

        with connection.cursor() as cur:
            cur.execute(
                "TRUNCATE runs_pendingwrite, runs_channelblob, runs_checkpoint, "
                "runs_thread CASCADE"
            )
        for name in ("PostgresSaver", "PostgresSaver+EncryptedSerializer"):
            self.conns[name].execute(
                "TRUNCATE checkpoints, checkpoint_blobs, checkpoint_writes"
            )
        self.conns["floor"].execute(
            "TRUNCATE floor_checkpoints, floor_blobs, floor_writes"
        )

    def vacuum(self) -> None:
        import psycopg

        with psycopg.connect(self.bench_url, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE")

    # writes

    def prepare_round(self, round_no: int) -> dict[str, tuple[object, list]]:
        """Each store's runner and its steps for one round, built untimed."""
        queues = {}
        for name in SAVERS:
            steps: list = []
            runner: object = self.savers.get(name)
            for t in range(self.args.threads):
                thread_id = f"r{round_no}-t{t}-{uuid.uuid4().hex[:6]}"
                if name == "floor":
                    runner = FloorSaver(
                        self.conns["floor"], _django_encoder(self.tenant, thread_id)
                    )
                    steps += runner.prepare(
                        Workload(runner, thread_id), self.args.steps
                    )
                    self.encode_seconds += runner.encode_seconds
                else:
                    steps += Workload(runner, thread_id).prepare(self.args.steps)
            queues[name] = (runner, steps)
        self.encode_calls += 2 * len(queues["floor"][1])
        return queues

    def writes(self) -> dict[str, list[float]]:
        results: dict[str, list[float]] = {name: [] for name in SAVERS}
        chunk = 10
        for round_no in range(self.args.rounds):
            self.truncate()
            self.empty_bytes = self.relation_bytes()
            queues = self.prepare_round(round_no)
            seconds = dict.fromkeys(SAVERS, 0.0)
            rng = random.Random(round_no)
            total = len(queues["floor"][1])
            # Ten steps at a time, the stores in turn (in a shuffled order), so a
            # busy moment of the machine falls on all of them alike.
            for start in range(0, total, chunk):
                order = list(SAVERS)
                rng.shuffle(order)
                for name in order:
                    runner, steps = queues[name]
                    part = steps[start : start + chunk]
                    if name == "floor":
                        seconds[name] += runner.run(part)
                    else:
                        seconds[name] += run_steps(runner, part)
            for name in SAVERS:
                results[name].append(2 * total / seconds[name])
                print(
                    f"  round {round_no + 1} {name:34s} "
                    f"{results[name][-1]:8.1f} writes/s"
                )
        return results

    # storage

    STORAGE = {
        "PostgresSaver": (
            "lg_plain",
            ("checkpoints", "checkpoint_blobs", "checkpoint_writes"),
        ),
        "PostgresSaver+EncryptedSerializer": (
            "lg_encrypted",
            ("checkpoints", "checkpoint_blobs", "checkpoint_writes"),
        ),
        "DjangoSaver": (
            "public",
            ("runs_checkpoint", "runs_channelblob", "runs_pendingwrite", "runs_thread"),
        ),
        "floor": ("floor", ("floor_checkpoints", "floor_blobs", "floor_writes")),
    }

    def relation_bytes(self) -> dict[str, int]:
        """Tables + indexes + TOAST of each store, as they stand."""
        import psycopg

        totals = {}
        with psycopg.connect(self.bench_url) as conn:
            for name, (schema, tables) in self.STORAGE.items():
                totals[name] = sum(
                    conn.execute(
                        "SELECT pg_total_relation_size(%s)", (f"{schema}.{table}",)
                    ).fetchone()[0]
                    for table in tables
                )
        return totals

    def sizes(self, empty: dict[str, int]) -> dict[str, float]:
        """Bytes per checkpoint the last round added to its emptied tables.

        Growth from the emptied tables, so the fixed cost of an empty table
        and its indexes is not spread over the checkpoints.
        """
        checkpoints = self.args.threads * self.args.steps
        now = self.relation_bytes()
        return {name: (now[name] - empty[name]) / checkpoints for name in now}

    def chat_sizes(self) -> dict[tuple[str, str], float]:
        """Bytes a chat thread of `--chat-steps` messages stores, per store.

        What the threads add to a store that already holds one (written first,
        unmeasured), divided by their number. From emptied tables the growth
        would also hold what a table pays once, not per thread: its free-space
        map (3 pages once it has a few), the first pages of its heap and of
        each index (`runs_thread` has several), and a part-filled page for each
        connection that inserts. Spread over the measured threads, that made
        the figure depend on how many there were (DjangoSaver: 0.252 MB a
        thread over 5, 0.224 over 15; from a store holding one, 0.211 over
        either). Several threads per store all the same, for the heap pages
        each connection leaves part-filled at the end.
        """
        from runs.checkpointer import DjangoSaver

        sizes = {}
        for name, channel in CHAT_STORES:
            self.truncate()
            saver = self.savers[name]
            if isinstance(saver, DjangoSaver):
                saver = DjangoSaver(tenant=self.tenant)
            graph = chat_graph(saver, channel, self.args.chat_steps)
            limit = self.args.chat_steps + 10
            graph.invoke(
                {"messages": []},
                {"configurable": {"thread_id": "chat-first"}, "recursion_limit": limit},
            )
            before = self.relation_bytes()[name]
            started = time.perf_counter()
            for t in range(self.args.chat_threads):
                config = {
                    "configurable": {"thread_id": f"chat-{t}-{uuid.uuid4().hex[:6]}"},
                    "recursion_limit": limit,
                }
                state = graph.invoke({"messages": []}, config)
                assert len(state["messages"]) == self.args.chat_steps
                # Read back as LangGraph does: the state rebuilt from the store.
                again = graph.get_state(config).values["messages"]
                assert again == state["messages"]
            seconds = time.perf_counter() - started
            sizes[(name, channel)] = (
                self.relation_bytes()[name] - before
            ) / self.args.chat_threads
            print(
                f"  chat {name} ({channel}): {sizes[(name, channel)] / 1e6:.3f} MB "
                f"per thread, {seconds:.1f}s"
            )
        return sizes

    # reads

    def get_tuple_latency(self) -> dict[str, list[float]]:
        from runs.checkpointer import DjangoSaver

        args = self.args
        self.truncate()
        readers = {}
        for name in SAVERS:
            if name == "floor":
                continue
            saver = self.savers[name]
            if isinstance(saver, DjangoSaver):
                saver = DjangoSaver(tenant=self.tenant)  # nothing cached
            thread_id = f"long-{uuid.uuid4().hex[:6]}"
            _, seconds = Workload(saver, thread_id, window=args.window).run(
                args.history
            )
            print(f"  {name}: {args.history} checkpoints written in {seconds:.1f}s")
            readers[name] = (
                saver,
                {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}},
            )
        self.vacuum()
        for saver, config in readers.values():
            for _ in range(20):  # warm caches, plans and prepared statements
                found = saver.get_tuple(config)
            assert found.metadata["step"] == args.history - 1, found.metadata
        # Interleaved, so that a busy moment of the machine hits every store.
        latencies: dict[str, list[float]] = {name: [] for name in readers}
        for _ in range(args.reads):
            for name, (saver, config) in readers.items():
                started = time.perf_counter()
                saver.get_tuple(config)
                latencies[name].append(time.perf_counter() - started)
        return latencies


def delta_read_latency(bench: Bench) -> dict[str, list[float]]:
    """Rebuilding a DeltaChannel at the head of a thread of `--history` steps:
    `get_delta_channel_history`, which LangGraph calls for every state it
    loads (short messages, so that the walk is measured, not the list)."""
    from runs.checkpointer import DjangoSaver

    args = bench.args
    readers = {}
    for name in ("PostgresSaver", "DjangoSaver"):
        saver = bench.savers[name]
        if isinstance(saver, DjangoSaver):
            saver = DjangoSaver(tenant=bench.tenant)
        config = {
            "configurable": {"thread_id": f"delta-long-{uuid.uuid4().hex[:6]}"},
            "recursion_limit": args.history + 10,
        }
        started = time.perf_counter()
        chat_graph(saver, "DeltaChannel", args.history, short=True).invoke(
            {"messages": []}, config
        )
        print(
            f"  {name}: a DeltaChannel thread of {args.history} steps in "
            f"{time.perf_counter() - started:.1f}s"
        )
        readers[name] = (saver, saver.get_tuple(config).config)
    bench.vacuum()
    for saver, head in readers.values():
        for _ in range(5):
            history = saver.get_delta_channel_history(
                config=head, channels=["messages"]
            )
        assert "seed" in history["messages"], "no snapshot found"
    latencies: dict[str, list[float]] = {name: [] for name in readers}
    for _ in range(args.reads):
        for name, (saver, head) in readers.items():
            started = time.perf_counter()
            saver.get_delta_channel_history(config=head, channels=["messages"])
            latencies[name].append(time.perf_counter() - started)
    return latencies


# --- report ------------------------------------------------------------------------


def _machine() -> dict[str, str]:
    from django.db import connection

    from bench.benchmarks_doc import cpu_model, load_average

    cpu = cpu_model()

    with connection.cursor() as cur:
        cur.execute("SHOW server_version")
        server = cur.fetchone()[0]
    packages = [
        "langgraph",
        "langgraph-checkpoint",
        "langgraph-checkpoint-postgres",
        "Django",
        "psycopg",
        "cryptography",
        "pycryptodome",
        "ormsgpack",
    ]
    load = load_average()
    return {
        "load": load,
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{cpu}, {os.cpu_count()} cores, {platform.system()} "
        f"{platform.release()}",
        "python": platform.python_version(),
        "postgres": server,
        "packages": ", ".join(f"{p} {version(p)}" for p in packages),
    }


def _percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


READING_NOTE = """\
Reading these figures:

- Every store here commits each `put` and each `put_writes` on its own, so
  their write rates follow the database's commit latency, and the machine's
  load: under load the stores converge, on an idle machine the floor pulls
  ahead. The gap to the floor is, per call: DjangoSaver's own encoding (the
  time stated above); the foreign keys from its rows to their thread, which
  Postgres checks at commit (measured apart on this machine: plain INSERTs
  into these tables take about 0.2 ms more with the constraints than
  without); and the statement that locks the thread row, checks it is alive
  and inserts from it, about 0.25 ms more than plain INSERTs. What it would
  take to come within 1.5x of the floor: dropping the foreign-key
  constraints (the saver's lock-and-check already keeps its rows from
  outliving their thread, but every other writer would lose the guarantee)
  and giving up the in-statement liveness check, which is what enforces the
  late-write rule; neither is worth the trade. A write that does not
  re-serialise and re-compress the whole message history at every step (a
  LangGraph `DeltaChannel` for the messages) would cut the encoding share.
- PostgresSaver's `get_tuple` slows as a thread grows: Postgres joins its
  blobs by scanning all of the thread's blob rows (a hash join), hence its
  figure above for 10,000 checkpoints. DjangoSaver looks each blob up through
  its unique index (`LATERAL ... LIMIT 1`) after finding the latest
  checkpoint by a backward index scan, so its read time does not depend on
  the thread's length.
- Storage: DjangoSaver compresses each value with zstd before encrypting it
  (ciphertext does not compress), which keeps it at PostgresSaver's size,
  whose large values Postgres compresses itself (pglz); with
  `EncryptedSerializer` Postgres can no longer compress and the store grows
  3.5-fold. For small states DjangoSaver's fixed cost per checkpoint (the
  AES-GCM nonce and tag of each value) makes it a few hundred bytes larger
  than PostgresSaver.
- The chat thread: with a `DeltaChannel` a step stores its one message once
  (in the node's pending-write row, with the conditional edge's branch: a
  task's writes are one row), and a snapshot of the whole list every 100
  updates (compressed at zstd's level 15: about 27 KB of ciphertext a
  thread here); the checkpoint row holds its ids and one ciphertext of
  the checkpoint with its metadata, compressed with a dictionary of
  LangGraph's format, its `ts` stored from its id's time (about 144 bytes).
  Ids are UUIDs in 16 bytes and each row's identity is its primary key, so
  a step is about 246 bytes of checkpoint row and 43 of key, and 416 of
  pending-write row (333 of them ciphertext) and 60 of key (keys filled to
  their pages' ends): with the snapshots and free space at page ends about
  1 KB a step (PostgresSaver's rows take about 2.7 KB). The figure is what
  the threads add to a store that already holds one: what a table pays
  once (its free-space map, 24 KB once it has one; the first pages of its
  heap and indexes; a part-filled page for each connection that inserts,
  and LangGraph writes from several executor threads) is not a thread's,
  and spread over the threads measured it made the figure depend on their
  number (0.252 MB a thread over 5, 0.224 over 15, against 0.211 MB). What
  is left beyond the ciphertexts is two rows' headers, ids and key
  entries, so the next cut is fewer rows (a step's writes kept with the
  checkpoint that follows them).
"""


def report(
    args, writes, sizes, latencies, encode_ms: float, chat: dict, delta: dict
) -> str:
    machine = _machine()
    medians = {name: statistics.median(rates) for name, rates in writes.items()}
    django = medians["DjangoSaver"]
    floor_ms = 1000 / medians["floor"]
    lines = [
        "## Checkpoint store",
        "",
        f"`bench/checkpoints.py` (`make bench-checkpoints`), run {machine['date']}.",
        "",
        f"- Machine: {machine['machine']}; Python {machine['python']}; "
        f"PostgreSQL {machine['postgres']} on the same machine; load average "
        f"at the end {machine['load']} (the machine is shared: other work ran "
        "meanwhile, which is why stores take turns).",
        f"- Versions: {machine['packages']}.",
        f"- Workload: {args.threads} threads x {args.steps} steps per round, "
        f"{args.rounds} rounds; state = a growing list of ~500-byte chat messages "
        "(dicts) plus 3 scalars; each step one `put` (changed channels only) and "
        "one `put_writes` of 2 writes. `get_tuple`: the latest checkpoint of a "
        f"thread with {args.history} checkpoints (messages window of "
        f"{args.window}), {args.reads} reads. Bytes per checkpoint: what the "
        "last round's threads added to their emptied tables (tables, indexes, "
        "TOAST), over its checkpoints; DjangoSaver's include its thread rows.",
        "- Floor: raw psycopg INSERTs of the very bytes DjangoSaver stores "
        "(encrypted beforehand, outside the timing), one transaction per put and "
        "per put_writes. Preparing them (serialise, compress, encrypt: the work "
        f"DjangoSaver does before the database) took {encode_ms:.2f} ms per call.",
        "- Writes: the stores take turns ten steps at a time, so that a busy "
        "moment of the machine falls on all of them; reads take turns call by "
        "call.",
        "",
        "| store | writes/s (median) | DjangoSaver ÷ this (writes) | get_tuple median | "
        "get_tuple p95 | bytes per checkpoint |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name in SAVERS:
        rate = medians[name]
        if name in latencies:
            median_ms = f"{statistics.median(latencies[name]) * 1000:.2f} ms"
            p95_ms = f"{_percentile(latencies[name], 0.95) * 1000:.2f} ms"
        else:
            median_ms = p95_ms = "n/a"
        ratio = "1.00" if name == "DjangoSaver" else f"{django / rate:.2f}"
        lines.append(
            f"| {name} | {rate:,.0f} | {ratio} | {median_ms} | {p95_ms} | "
            f"{sizes[name]:,.0f} |"
        )
    targets = []

    def target(ok: bool, text: str) -> None:
        targets.append(f"- {'met' if ok else 'MISSED'}: {text}")

    encrypted = "PostgresSaver+EncryptedSerializer"
    target(
        django / medians[encrypted] >= 1.0,
        f"writes at least as fast as {encrypted} "
        f"(ratio {django / medians[encrypted]:.2f}, target >= 1.0)",
    )
    target(
        medians["floor"] / django <= 1.5,
        f"within 1.5x of the raw-insert floor (the floor is "
        f"{medians['floor'] / django:.2f}x faster; the floor plus DjangoSaver's "
        f"encoding, {floor_ms:.2f} + {encode_ms:.2f} ms per call, would be "
        f"{1000 / django / (floor_ms + encode_ms):.2f}x faster)",
    )
    lg_latency = statistics.median(latencies["PostgresSaver"])
    dj_latency = statistics.median(latencies["DjangoSaver"])
    target(
        dj_latency <= lg_latency,
        f"get_tuple no slower than PostgresSaver ({dj_latency * 1000:.2f} ms vs "
        f"{lg_latency * 1000:.2f} ms)",
    )
    target(
        sizes["DjangoSaver"] <= sizes["PostgresSaver"],
        f"storage no larger than PostgresSaver ({sizes['DjangoSaver']:,.0f} vs "
        f"{sizes['PostgresSaver']:,.0f} bytes per checkpoint)",
    )
    chat_bytes = chat[("DjangoSaver", "DeltaChannel")]
    target(
        chat_bytes < CHAT_TARGET_BYTES,
        f"a {args.chat_steps}-step chat thread with the messages in a DeltaChannel "
        f"under {CHAT_TARGET_BYTES / 1e6:.1f} MB ({chat_bytes / 1e6:.3f} MB per "
        "thread added to a store that already holds one; see the method note "
        "under the chat table)",
    )
    lg_delta = statistics.median(delta["PostgresSaver"])
    dj_delta = statistics.median(delta["DjangoSaver"])
    target(
        dj_delta <= lg_delta,
        f"a DeltaChannel rebuilt at the head of a {args.history}-step thread "
        f"(get_delta_channel_history) no slower than PostgresSaver "
        f"({dj_delta * 1000:.2f} ms vs {lg_delta * 1000:.2f} ms, median; p95 "
        f"{_percentile(delta['DjangoSaver'], 0.95) * 1000:.2f} ms vs "
        f"{_percentile(delta['PostgresSaver'], 0.95) * 1000:.2f} ms)",
    )
    lines += [
        "",
        f"A chat thread of {args.chat_steps} steps through a real graph (one node "
        "adding one ~500-byte message per super-step, `invoke` once, then "
        "`get_state` read back and compared), bytes in the database per thread "
        f"(tables, indexes, TOAST; what {args.chat_threads} threads add to a "
        "store already holding one, per thread: a table's one-time pages are "
        "not a thread's). With "
        "`list` the messages are a plain reducer channel (a new blob of the "
        "whole list at every step); with `DeltaChannel` (LangGraph's, default "
        "cadence: a snapshot every 100 updates) each step stores only its "
        "write:",
        "",
        "| store | message channel | bytes per chat thread |",
        "|---|---|---:|",
        *(
            f"| {name} | {channel} | {chat[(name, channel)]:,.0f} |"
            for name, channel in CHAT_STORES
        ),
        "",
        CHAT_METHOD + " The bytes per checkpoint of the write workload above "
        "are still measured from emptied tables.",
    ]
    lines += ["", "Targets:", "", *targets, "", READING_NOTE, ""]
    if args.note:
        lines += [Path(args.note).read_text().strip(), ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=3, help="threads per round")
    parser.add_argument("--steps", type=int, default=200, help="steps per thread")
    parser.add_argument("--rounds", type=int, default=3, help="write rounds")
    parser.add_argument(
        "--history", type=int, default=10_000, help="checkpoints of the read thread"
    )
    parser.add_argument(
        "--window", type=int, default=20, help="messages kept in the read thread"
    )
    parser.add_argument("--reads", type=int, default=300, help="get_tuple samples")
    parser.add_argument(
        "--no-write", action="store_true", help="print, leave docs/benchmarks.md"
    )
    parser.add_argument("--note", help="a file whose text closes the report")
    parser.add_argument(
        "--chat-steps", type=int, default=200, help="messages of the chat thread"
    )
    parser.add_argument(
        "--chat-threads", type=int, default=5, help="chat threads per store"
    )
    parser.add_argument(
        "--chat-only", action="store_true", help="measure the chat thread alone"
    )
    parser.add_argument(
        "--keep-database", action="store_true", help="do not drop <name>_bench"
    )
    args = parser.parse_args()

    server_url = os.environ.get(
        "DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gatehouse"
    )
    if not server_url.startswith("postgres"):
        sys.exit("DATABASE_URL must point at PostgreSQL")
    name, bench_url = _bench_url(server_url)
    _create_database(server_url, name)
    bench = Bench(args, bench_url.replace("postgres://", "postgresql://", 1))
    try:
        _setup_django(bench_url)
        bench.open()
        print(f"chat: {args.chat_threads} threads of {args.chat_steps} steps per store")
        chat = bench.chat_sizes()
        print(
            f"  goal: under {CHAT_TARGET_BYTES / 1e6:.1f} MB (DjangoSaver, DeltaChannel)"
        )
        print(f"  {CHAT_METHOD}")
        if args.chat_only:
            return
        print(f"writes: {args.rounds} rounds of {args.threads} x {args.steps} steps")
        writes = bench.writes()
        sizes = bench.sizes(bench.empty_bytes)
        print(f"get_tuple: a thread of {args.history} checkpoints")
        latencies = bench.get_tuple_latency()
        print(
            f"get_delta_channel_history: a DeltaChannel thread of {args.history} steps"
        )
        delta = delta_read_latency(bench)
        encode_ms = bench.encode_seconds / bench.encode_calls * 1000
        section = report(args, writes, sizes, latencies, encode_ms, chat, delta)
        print()
        print(section)
        if not args.no_write:
            from bench.benchmarks_doc import DOC, write_section

            write_section("Checkpoint store", section)
            print(f"written to {DOC}")
    finally:
        bench.close()
        if not args.keep_database:
            _drop_database(server_url, name)


if __name__ == "__main__":
    main()
