"""runs 0019, 0020 and 0023: checkpoint and task ids are stored as compact
bytes (a UUID in 16), and checkpoints, writes and channel blobs are keyed by
their identity without a surrogate id. Rows written before read the same after, on Postgres and on
SQLite (the embedded mode), and the migrations reverse to the text ids and
surrogate keys they started from."""

import pytest
from django.db import connections
from django.db.migrations.executor import MigrationExecutor
from langgraph.checkpoint.base import empty_checkpoint

from runs.checkpointer import DjangoSaver
from runs.models import Checkpoint, PendingWrite, Tenant
from runs.models.checkpoints import compact_id, id_text

BEFORE = [("runs", "0018_toolcall_settled_at")]

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])

# LangGraph's ids are UUIDs; any other text must survive too, 15 bytes (whose
# terminated form would be 16, a UUID's length) included.
UUID_IDS = [
    "1f1ed23e-1ef6-6489-8063-5343d56c9fb5",
    "1f1ed23e-1ef7-603f-8064-bb076a225329",
]
OTHER_IDS = ["checkpoint-0015", "c2", "C3-UPPER-ÄÖ"]
RUN_ID = "0b6e8c1e-7f3a-4d2b-9a51-2f1c0e9d8b7a"


def _migrate(alias: str, targets) -> None:
    executor = MigrationExecutor(connections[alias])
    executor.loader.build_graph()
    executor.migrate(targets or executor.loader.graph.leaf_nodes())


def _write_thread(saver: DjangoSaver, thread_id: str, ids: list[str]) -> None:
    parent = None
    for n, checkpoint_id in enumerate(ids):
        checkpoint = empty_checkpoint()
        checkpoint["id"] = checkpoint_id
        checkpoint["channel_values"] = {"step": n, "note": "x" * 2000}
        versions = {"step": f"{n + 1:032}.0", "note": "1"}
        checkpoint["channel_versions"] = versions
        config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
        if parent:
            config["configurable"]["checkpoint_id"] = parent
        saved = saver.put(config, checkpoint, {"step": n, "run_id": RUN_ID}, versions)
        saver.put_writes(saved, [("step", n + 1), ("note", "y")], task_id=ids[0])
        saver.put_writes(saved, [("__error__", "boom")], task_id=f"task-{n}")
        parent = checkpoint_id


def _read(saver: DjangoSaver, thread_id: str) -> list:
    config = {"configurable": {"thread_id": thread_id}}
    return [
        (
            t.config["configurable"]["checkpoint_id"],
            (t.parent_config or {}).get("configurable", {}).get("checkpoint_id"),
            t.checkpoint["channel_values"],
            t.metadata["step"],
            sorted(t.pending_writes, key=repr),
        )
        for t in saver.list(config)
    ] + [saver.get_tuple(config).config["configurable"]["checkpoint_id"]]


def test_compact_id_round_trips_and_keeps_the_order():
    for text in ["", *UUID_IDS, *OTHER_IDS, "x" * 15, "y" * 16]:
        assert id_text(compact_id(text)) == text
    assert len(compact_id(UUID_IDS[0])) == 16
    assert len(compact_id("x" * 15)) == 17
    assert compact_id(UUID_IDS[0]) < compact_id(UUID_IDS[1])
    assert sorted(OTHER_IDS, key=compact_id) == sorted(
        OTHER_IDS, key=lambda text: text.encode()
    )
    # Not canonical (upper case): kept as text, read back as written.
    assert id_text(compact_id(UUID_IDS[0].upper())) == UUID_IDS[0].upper()


@pytest.mark.parametrize("alias", ["default", "sqlite"])
def test_rows_written_before_read_the_same_after(alias):
    tenant = Tenant.objects.using(alias).create(slug="compact", name="C")
    saver = DjangoSaver(tenant=tenant, using=alias)
    _write_thread(saver, "uuids", UUID_IDS)
    _write_thread(saver, "others", OTHER_IDS)
    before = {thread: _read(saver, thread) for thread in ("uuids", "others")}
    assert before["uuids"][-1] == UUID_IDS[-1]
    stored = PendingWrite.objects.using(alias).values_list("task_id", flat=True)
    assert set(stored) == {UUID_IDS[0], OTHER_IDS[0], "task-0", "task-1", "task-2"}
    try:
        _migrate(alias, BEFORE)
        with connections[alias].cursor() as cursor:
            cursor.execute(
                f"SELECT checkpoint_id, parent_checkpoint_id "
                f"FROM {Checkpoint._meta.db_table}"
            )
            texts = set(cursor.fetchall())
            cursor.execute(f"SELECT DISTINCT run_id FROM {Checkpoint._meta.db_table}")
            assert cursor.fetchall() == [(RUN_ID,)]
            if alias == "default":
                cursor.execute(
                    "SELECT count(*) FROM information_schema.columns WHERE "
                    "column_name = 'id' AND table_name IN "
                    "('runs_checkpoint', 'runs_pendingwrite', 'runs_channelblob')"
                )
                assert cursor.fetchone() == (3,)
        assert texts == {
            (UUID_IDS[0], ""),
            (UUID_IDS[1], UUID_IDS[0]),
            (OTHER_IDS[0], ""),
            (OTHER_IDS[1], OTHER_IDS[0]),
            (OTHER_IDS[2], OTHER_IDS[1]),
        }
    finally:
        _migrate(alias, None)
    fresh = DjangoSaver(tenant=tenant, using=alias)
    by_run = {"run_id": RUN_ID}
    assert (
        len(list(fresh.list({"configurable": {"thread_id": "uuids"}}, filter=by_run)))
        == 2
    )
    assert {thread: _read(fresh, thread) for thread in before} == before
    with connections[alias].cursor() as cursor:
        cursor.execute(f"SELECT checkpoint_id FROM {Checkpoint._meta.db_table}")
        lengths = {len(bytes(value)) for (value,) in cursor.fetchall()}
        if alias == "default":
            # Postgres: the identity is the primary key, and the id is gone.
            cursor.execute(
                "SELECT conrelid::regclass::text, pg_get_constraintdef(oid) "
                "FROM pg_constraint WHERE contype = 'p' AND conrelid IN "
                "('runs_checkpoint'::regclass, 'runs_pendingwrite'::regclass, "
                "'runs_channelblob'::regclass)"
            )
            assert dict(cursor.fetchall()) == {
                "runs_checkpoint": "PRIMARY KEY (thread_id, checkpoint_ns, "
                "checkpoint_id)",
                "runs_pendingwrite": "PRIMARY KEY (thread_id, checkpoint_ns, "
                "checkpoint_id, task_id, idx)",
                "runs_channelblob": "PRIMARY KEY (thread_id, checkpoint_ns, "
                "channel, version)",
            }
            cursor.execute(
                "SELECT count(*) FROM information_schema.columns WHERE column_name "
                "= 'id' AND table_name IN ('runs_checkpoint', 'runs_pendingwrite', "
                "'runs_channelblob')"
            )
            assert cursor.fetchone() == (0,)
            # The rebuilt tables are analyzed, not left without statistics
            # until autovacuum gets to them.
            cursor.execute(
                "SELECT count(*) FROM pg_stats WHERE tablename = 'runs_pendingwrite'"
            )
            assert cursor.fetchone()[0] > 0
    assert 16 in lengths
