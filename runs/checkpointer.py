"""DjangoSaver: LangGraph's checkpoint store on Django models, encrypted per thread.

`DjangoSaver(tenant=tenant)` is a `BaseCheckpointSaver` bound to one tenant: a
`thread_id` in a config names that tenant's thread, and `list(None)` lists only
that tenant's checkpoints. It stores what LangGraph's `PostgresSaver` stores,
in the same shape (docs/checkpoints.md has the details):

- `Checkpoint`: one row per checkpoint; the checkpoint itself encrypted, with
  small scalar channel values inside it, and its metadata encrypted apart.
- `ChannelBlob`: one row per (thread, namespace, channel, version), written only
  when `put` is told the channel has a new version, so a channel that did not
  change is not copied again.
- `PendingWrite`: a task's writes; special channels (`__error__`,
  `__interrupt__`, `__resume__`, ...) are upserted, the rest inserted once.

Every value is ciphertext under the thread's data key (`runs.crypto`), bound
to its row, and loaded through `runs.serde.StrictSerializer`.

A thread that does not exist is created, with a fresh data key, by the first
write to it. A deleted thread (`delete_thread`) keeps a tombstone row, and
every later write naming it raises `ThreadDeleted`: a run still in flight
cannot bring it back. A saver also remembers which thread row each thread id
named when it first wrote to it, so a late write from its run is refused
even when the id has meanwhile been given to a new thread.

Each write takes `FOR KEY SHARE` on its thread's row (Postgres) and checks it
is alive in the same transaction; shredding, deleting and pruning take
`FOR UPDATE`, so they wait for writes in flight and later writes wait for them.
A worker's writes for a run (`adopt(..., lease=...)`) also check, in the same
statement, that the run is still its own (`Run.held`), with the run's row
`FOR SHARE`: once another worker took the run over, they raise `LeaseLost`
with nothing written.

On Postgres the hot paths are single prepared statements, as PostgresSaver's
are: a `put` or `put_writes` to a thread this saver already wrote to is one
statement (lock, check, insert), and `get_tuple` one query (the checkpoint,
its blobs and its writes). Other databases (SQLite) take the portable path:
the ORM in a transaction, and two or three queries per read.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import os
import secrets
import threading
from collections import defaultdict
from collections.abc import (
    AsyncIterator,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import dataclass
from functools import cache, lru_cache
from types import SimpleNamespace
from typing import Any

import psycopg
from asgiref.sync import sync_to_async
from django.db import DEFAULT_DB_ALIAS, IntegrityError, connections, transaction
from django.db.models import Q, Subquery
from django.utils import timezone
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    CheckpointMetadata,
    CheckpointTuple,
    DeltaChannelHistory,
    get_checkpoint_id,
    get_serializable_checkpoint_metadata,
    writes_sort_key,
)
from langgraph.checkpoint.base import Checkpoint as LangGraphCheckpoint
from langgraph.checkpoint.serde.types import _DeltaSnapshot

from runs import crypto, outages, storage, thread_connections
from runs.checkpoint_ts import read_ts, stored_ts
from runs.crypto import ThreadCipher, ThreadDeleted, writes_earlier_format
from runs.models import (
    LEASE_HELD_SQL,
    ChannelBlob,
    Checkpoint,
    LeaseLost,
    PendingWrite,
    Run,
    Tenant,
    Thread,
)
from runs.models.checkpoints import compact_id, id_text
from runs.serde import StrictSerializer

PRUNE_STRATEGIES = ("keep_latest", "delete")
# Channel values small enough to travel inside the encrypted checkpoint row
# instead of a blob row of their own (PostgresSaver's "inline" values).
INLINE_STR_MAX = 1024
# Metadata keys copied to plaintext columns, so list(filter=...) narrows in SQL.
_COLUMN_FILTERS = {"source": str, "step": int, "run_id": str}
_DELTA_METADATA_KEYS = ("counters_since_delta_snapshot", "delta_writes_versioned")
_BATCH = 500
_LIST_CHUNK = 100
# A put_writes call's regular writes (one or more) are stored as one row: its
# idx is this plus the first write's position (special channels have negative
# idx, regular writes their position), its channel and task path are empty,
# and its value is the encrypted [task path, [[idx, channel, serialized
# value], ...]] (kind "writes"; rows written before 2026-12-01 hold the list
# alone, their task path in the column). A lone regular write is packed too,
# so that a task's later call finds the earlier call's row in its place and,
# like PostgresSaver, keeps the first.
PACKED_WRITES_IDX = 1 << 30
# The graph's own checkpoint namespace; a subgraph's is "<node>:<task id>",
# new at every call. Only the root's head is kept (DjangoSaver.head): a run
# reads no other, and one kept per subgraph call would pile up for the run.
ROOT_NS = ""
# A checkpoint and its metadata are one ciphertext, [checkpoint, metadata], of
# this kind, in the `checkpoint` column; `metadata` is left empty. Rows written
# before hold them apart (kinds "checkpoint" and "metadata").
CHECKPOINT_WITH_METADATA = "checkpoint+metadata"

_CHECKPOINT_FIELDS = (
    "thread_id",
    "thread__thread_id",
    "thread__wrapped_data_key",
    "thread__data_key_id",
    "checkpoint_ns",
    "checkpoint_id",
    "parent_checkpoint_id",
    "blob_versions",
    "checkpoint",
    "metadata",
)
# The same, in SQL over `{checkpoint} c JOIN {thread} t`.
_ROW_COLUMNS = (
    "c.thread_id, t.thread_id, t.wrapped_data_key, t.data_key_id, c.checkpoint_ns, "
    "c.checkpoint_id, c.parent_checkpoint_id, c.blob_versions, c.checkpoint, "
    "c.metadata"
)


@dataclass(frozen=True)
class _Row:
    """A checkpoint row as `_CHECKPOINT_FIELDS` selects it (`from_sql`: as
    `_ROW_COLUMNS` does, its ids still stored bytes)."""

    thread_pk: int
    thread_id: str
    wrapped: bytes | memoryview | None
    key_id: str
    ns: str
    checkpoint_id: str
    parent_checkpoint_id: str
    blob_versions: dict[str, str] | str
    checkpoint: bytes | memoryview
    metadata: bytes | memoryview

    @classmethod
    def from_sql(cls, values: Sequence[Any]) -> _Row:
        pk, thread_id, wrapped, key_id, ns, checkpoint_id, parent, *rest = values
        return cls(
            pk,
            thread_id,
            wrapped,
            key_id,
            ns,
            id_text(checkpoint_id),
            id_text(parent),
            *rest,
        )


def _head_as_read(
    thread: Thread,
    checkpoint: Sequence[Any],
    stored_blobs: Sequence[Any] | None,
    stored_writes: Sequence[Any] | None,
) -> tuple[_Row, dict, list]:
    """latest_head_sql's values as get_tuple takes its statement's row apart:
    the checkpoint's row (with the thread's key, as read with them), its
    blobs by key, its writes."""
    checkpoint_id, parent, versions, body, metadata = checkpoint
    row = _Row(
        thread.pk,
        str(thread.thread_id),
        thread.wrapped_data_key,
        thread.data_key_id,
        ROOT_NS,
        id_text(checkpoint_id),
        id_text(parent),
        json.loads(bytes(versions)),
        body,
        metadata,
    )
    blobs = {
        (row.thread_pk, row.ns, bytes(channel).decode(), bytes(version).decode()): value
        for channel, version, value in stored_blobs or ()
    }
    writes = [
        (
            id_text(task_id),
            int(bytes(idx)),
            bytes(channel).decode(),
            bytes(path).decode(),
            value,
        )
        for task_id, idx, channel, path, value in stored_writes or ()
    ]
    return row, blobs, writes


class VersionSequence:
    """A saver's channel versions: PostgresSaver's zero-padded counter, which
    orders a channel's versions, then a tie-breaker.

    The tie-breaker is what keeps two forks of one checkpoint (two resumes or
    state updates from it) from giving a channel the same version: a blob's
    key is its version, and the second fork's blob would otherwise be dropped
    as already stored and the first fork's read in its place. PostgresSaver's
    is a random float per call (~18 digits); this is a random 64-bit token and
    a counter, unique within the sequence by construction and across
    sequences by the token, and ~18 bytes smaller per checkpoint once
    compressed, since a checkpoint's versions mostly share the token. One
    sequence per saver, and a saver serves one tenant: versions stored in
    clear (`runs_channelblob.version`, `blob_versions`) link no two tenants'
    rows, nor say how much another tenant wrote. Drawn again in a forked
    child (the pid is checked). Readers only ever compare versions and parse
    the counter before the dot, so versions of either form mix.
    """

    def __init__(self) -> None:
        # (pid, token, counter), replaced whole, so that a thread never pairs
        # one token with another's counter. `next()` on an itertools.count is
        # atomic under the GIL: threads sharing a token never share a count.
        self._state: tuple[int, str, Iterator[int]] = (0, "", itertools.count(1))

    def after(self, current: str | int | None) -> str:
        if current is None:
            number = 0
        elif isinstance(current, int):
            number = current
        else:
            number = int(current.split(".")[0])
        pid, token, counter = self._state
        if pid != os.getpid():
            pid, token, counter = self._state = (
                os.getpid(),
                secrets.token_hex(8),
                itertools.count(1),
            )
        return f"{number + 1:032}.{token}{next(counter):x}"


@dataclass(frozen=True)
class _PutPlan:
    """What a put stores, before encryption."""

    ns: str
    checkpoint_id: str
    parent_checkpoint_id: str
    step: int | None
    source: str
    run_id: str
    body: dict[str, Any]
    metadata: dict[str, Any]
    blobs: list[tuple[str, str, Any]]  # channel, version, value
    blob_versions: dict[str, str]  # every blob the checkpoint uses
    uses_delta: bool


@dataclass(frozen=True)
class _SealedPut:
    checkpoint: bytes
    metadata: bytes
    blobs: list[tuple[str, str, bytes]]


# The one-round-trip write path (Postgres): a single statement locks the
# thread's row FOR KEY SHARE, inserts only if the thread is alive (not shredded,
# not deleted) and answers whether it was. A deletion holding the row FOR UPDATE
# makes it wait, then find the thread dead and insert nothing.
_ALIVE_THREAD = (
    "WITH t AS (SELECT id FROM {thread} WHERE id = %s AND deleted_at IS NULL "
    "AND wrapped_data_key IS NOT NULL FOR KEY SHARE)"
)
# The same for a write made for a worker's run (DjangoSaver.adopt's `lease`):
# the thread alive and the run still the worker's (Run.held), in the write's
# statement. The run's row is locked FOR SHARE after the thread's (the lock
# order: thread, then run), which a claim's or finish's lock of the run
# (FOR NO KEY UPDATE) conflicts with: a takeover waits for the writes in
# flight, and a write after it waits for its commit and then finds the run
# no longer held (READ COMMITTED rechecks a locked row's condition).
_LEASED_THREAD = (
    "WITH t AS (SELECT th.id FROM {thread} th JOIN {run} r ON r.thread_id = th.id "
    "WHERE th.id = %s AND th.deleted_at IS NULL AND th.wrapped_data_key IS NOT NULL "
    f"AND {LEASE_HELD_SQL} FOR KEY SHARE OF th FOR SHARE OF r)"
)


def _guard(leased: bool) -> str:
    """The statement's first part: `t`, the thread if the write may go on."""
    guard = _LEASED_THREAD if leased else _ALIVE_THREAD
    return guard.format(thread=Thread._meta.db_table, run=Run._meta.db_table)


@lru_cache(maxsize=64)
def _put_statement(blob_count: int, leased: bool = False) -> str:
    parts = [_guard(leased)]
    if blob_count:
        rows = ", ".join(["(%s::text, %s::text, %s::bytea)"] * blob_count)
        parts.append(
            f"blobs AS (INSERT INTO {ChannelBlob._meta.db_table} "
            "(thread_id, checkpoint_ns, channel, version, value) "
            "SELECT t.id, %s::text, v.channel, v.version, v.value "
            f"FROM t, (VALUES {rows}) AS v(channel, version, value) "
            "ON CONFLICT (thread_id, checkpoint_ns, channel, version) DO NOTHING)"
        )
    parts.append(
        f"saved AS (INSERT INTO {Checkpoint._meta.db_table} (thread_id, "
        "checkpoint_ns, checkpoint_id, parent_checkpoint_id, step, source, run_id, "
        "blob_versions, checkpoint, metadata, created_at) "
        "SELECT t.id, %s::text, %s::bytea, %s::bytea, %s::integer, %s::text, "
        "%s::bytea, %s::jsonb, %s::bytea, %s::bytea, %s::timestamptz FROM t "
        "ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id) DO UPDATE SET "
        "checkpoint = EXCLUDED.checkpoint, metadata = EXCLUDED.metadata, "
        "step = EXCLUDED.step, source = EXCLUDED.source, run_id = EXCLUDED.run_id, "
        "blob_versions = EXCLUDED.blob_versions)"
    )
    return ", ".join(parts) + " SELECT count(*) FROM t"


@lru_cache(maxsize=64)
def _put_writes_statement(write_count: int, upsert: bool, leased: bool = False) -> str:
    """Answers whether the thread is alive (and, `leased`, the run still
    held), for inserts whether a packed row was inserted (0 when the task's
    earlier call holds its place), and how many rows were stored (upserted,
    or inserted where none was)."""
    rows = ", ".join(["(%s::integer, %s::text, %s::text, %s::bytea)"] * write_count)
    on_conflict = (
        "DO UPDATE SET channel = EXCLUDED.channel, task_path = EXCLUDED.task_path, "
        "value = EXCLUDED.value"
        if upsert
        else "DO NOTHING"
    )
    return (
        _guard(leased)
        + f", saved AS (INSERT INTO {PendingWrite._meta.db_table} (thread_id, "
        "checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, value) "
        "SELECT t.id, %s::text, %s::bytea, %s::bytea, v.task_path, v.idx, "
        f"v.channel, v.value FROM t, (VALUES {rows}) AS v(idx, channel, task_path, "
        "value) "
        "ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) "
        f"{on_conflict} RETURNING idx) SELECT (SELECT count(*) FROM t), "
        f"(SELECT count(*) FROM saved WHERE idx >= {PACKED_WRITES_IDX}), "
        "(SELECT count(*) FROM saved)"
    )


# A checkpoint's blobs and writes as arrays, over `{checkpoint} c`: LATERAL
# and LIMIT (a fence against flattening) look each blob up in its index,
# never scanning all the thread's blobs.
_BLOBS_OF_C = (
    "(SELECT array_agg(ARRAY[convert_to(b.channel, 'UTF8'), "
    "convert_to(b.version, 'UTF8'), b.value]) "
    "FROM jsonb_each_text(c.blob_versions) AS used "
    f"CROSS JOIN LATERAL (SELECT * FROM {ChannelBlob._meta.db_table} WHERE "
    "thread_id = c.thread_id AND checkpoint_ns = c.checkpoint_ns AND channel = "
    "used.key AND version = used.value LIMIT 1) AS b)"
)
_WRITES_OF_C = (
    "(SELECT array_agg(ARRAY[w.task_id, "
    "convert_to(w.idx::text, 'UTF8'), convert_to(w.channel, 'UTF8'), "
    "convert_to(w.task_path, 'UTF8'), w.value]) "
    f"FROM {PendingWrite._meta.db_table} w WHERE w.thread_id = c.thread_id "
    "AND w.checkpoint_ns = c.checkpoint_ns "
    "AND w.checkpoint_id = c.checkpoint_id)"
)


def _thread_where() -> str:
    """get_tuple's condition on a thread's checkpoints of one namespace (its
    parameters: the tenant's pk, the thread's id, the namespace). The thread's
    id is resolved first, so the latest checkpoint comes from a backward scan
    of its unique index, whatever the thread's length."""
    return (
        f"c.thread_id = (SELECT id FROM {_read_tables().thread} WHERE tenant_id = %s "
        "AND thread_id = %s AND deleted_at IS NULL) AND c.checkpoint_ns = %s"
    )


@lru_cache(maxsize=8)
def _pg_get_tuple_statement(where: str) -> str:
    """A checkpoint with its blobs and writes as arrays, as PostgresSaver does."""
    tables = _read_tables()
    return (
        f"SELECT {_ROW_COLUMNS}, {_BLOBS_OF_C}, {_WRITES_OF_C} "
        f"FROM {tables.checkpoint} c JOIN {tables.thread} t ON t.id = c.thread_id "
        f"WHERE {where} ORDER BY c.checkpoint_id DESC LIMIT 1"
    )


# The ancestor walk of `get_delta_channel_history` in one round trip: the
# target checkpoint and its parents, newest first, until every requested
# channel has met a checkpoint that stores a value for it (its plaintext
# `blob_versions` names it: a `_DeltaSnapshot` is always a blob); then the
# walked checkpoints' writes to those channels, and each channel's nearest
# stored value. Every lookup goes through a unique index, so the cost follows
# the walk (at most the DeltaChannel's snapshot cadence), not the thread.
# Which checkpoint seeds a channel is decided in Python from the decrypted
# checkpoints: they alone are trusted, and they also hold small values inline.
@cache
def _pg_delta_history_statement(latest: bool) -> str:
    tables = _read_tables()
    target = "" if latest else "AND c.checkpoint_id = %(checkpoint_id)s "
    # LATERAL and LIMIT (fences against flattening): each step of the walk and
    # each checkpoint's writes are one index lookup, never a scan of all the
    # thread's rows joined afterwards.
    return (
        f"WITH RECURSIVE t AS (SELECT id, thread_id, wrapped_data_key, data_key_id "
        f"FROM {tables.thread} WHERE tenant_id = %(tenant)s AND thread_id = "
        "%(thread_id)s AND deleted_at IS NULL), "
        "chain AS ("
        "(SELECT c.checkpoint_id, c.parent_checkpoint_id, c.blob_versions, "
        "c.checkpoint, octet_length(c.metadata) = 0 AS packed, 0 AS depth, "
        "'{}'::text[] AS found "
        f"FROM {tables.checkpoint} c WHERE c.thread_id = (SELECT id FROM t) "
        f"AND c.checkpoint_ns = %(ns)s {target}"
        "ORDER BY c.checkpoint_id DESC LIMIT 1) "
        "UNION ALL "
        "SELECT c.checkpoint_id, c.parent_checkpoint_id, c.blob_versions, "
        "c.checkpoint, octet_length(c.metadata) = 0, chain.depth + 1, "
        "chain.found || ARRAY(SELECT ch FROM "
        "unnest(%(channels)s::text[]) AS ch WHERE c.blob_versions ? ch) "
        "FROM chain CROSS JOIN LATERAL (SELECT checkpoint_id, "
        "parent_checkpoint_id, blob_versions, checkpoint, metadata "
        f"FROM {tables.checkpoint} WHERE thread_id = (SELECT id FROM t) "
        "AND checkpoint_ns = %(ns)s AND checkpoint_id = chain.parent_checkpoint_id "
        "LIMIT 1) AS c "
        "WHERE NOT chain.found @> %(channels)s::text[]), "
        "seeds AS (SELECT DISTINCT ON (ch) ch, chain.blob_versions ->> ch AS version "
        "FROM chain, unnest(%(channels)s::text[]) AS ch WHERE chain.depth > 0 "
        "AND chain.blob_versions ? ch ORDER BY ch, chain.depth) "
        # kind, depth, checkpoint id, channel, task id, idx, task path or
        # parent or version, value; the text of the third and seventh columns
        # as bytes, like the ids there (`_delta_row` reads them).
        "SELECT 't', 0, convert_to(t.thread_id, 'UTF8'), t.data_key_id, "
        "NULL::bytea, t.id, NULL::bytea, t.wrapped_data_key FROM t "
        # A checkpoint's channel: whether its metadata is packed with it.
        "UNION ALL SELECT 'c', depth, checkpoint_id, "
        "CASE WHEN packed THEN 'packed' END, NULL, NULL, "
        "parent_checkpoint_id, checkpoint FROM chain "
        "UNION ALL SELECT 'w', chain.depth, chain.checkpoint_id, w.channel, "
        "w.task_id, w.idx, convert_to(w.task_path, 'UTF8'), w.value "
        "FROM chain CROSS JOIN LATERAL "
        "(SELECT channel, task_id, idx, task_path, value "
        f"FROM {tables.write} WHERE thread_id = (SELECT id FROM t) "
        "AND checkpoint_ns = %(ns)s AND checkpoint_id = chain.checkpoint_id "
        "AND (channel = ANY(%(channels)s::text[]) "
        f"OR idx >= {PACKED_WRITES_IDX}) OFFSET 0) AS w "
        "WHERE chain.depth > 0 "
        "UNION ALL SELECT 'b', 0, NULL, seeds.ch, NULL, NULL, "
        "convert_to(seeds.version, 'UTF8'), b.value "
        "FROM seeds CROSS JOIN LATERAL (SELECT value FROM "
        f"{tables.blob} WHERE thread_id = (SELECT id FROM t) AND checkpoint_ns = "
        "%(ns)s AND channel = seeds.ch AND version = seeds.version LIMIT 1) AS b"
    )


def _delta_row(row: Sequence[Any]) -> tuple:
    """A row of `_pg_delta_history_statement` with its ids and text decoded."""
    kind, depth, checkpoint_id, channel, task_id, idx, text, value = row
    if kind == "t":
        return (kind, depth, checkpoint_id.decode(), channel, task_id, idx, text, value)
    return (
        kind,
        depth,
        None if checkpoint_id is None else id_text(checkpoint_id),
        channel,
        None if task_id is None else id_text(task_id),
        idx,
        # A checkpoint's parent (an id); a write's task path, a blob's version.
        id_text(text) if kind == "c" else text.decode(),
        value,
    )


@cache
def _read_tables() -> SimpleNamespace:
    return SimpleNamespace(
        thread=Thread._meta.db_table,
        checkpoint=Checkpoint._meta.db_table,
        blob=ChannelBlob._meta.db_table,
        write=PendingWrite._meta.db_table,
    )


@dataclass(frozen=True)
class _LiveThread:
    pk: int
    thread_id: str
    cipher: ThreadCipher
    uses_delta_channels: bool


@dataclass
class _Head:
    """A worker's copy of its thread's latest checkpoint in a namespace, as
    stored: the row, the blob rows it uses, its write rows (keyed by task id
    and idx, the key of their unique index). Bytes as the database holds
    them, so that a tuple built from it goes through the same decryption as
    one read back (see DjangoSaver.head)."""

    row: _Row
    blobs: dict[tuple[str, str], bytes]  # (channel, version) -> value
    writes: dict[tuple[str, int], tuple]  # -> (task id, idx, channel, path, value)

    def fingerprint(self) -> str:
        """What head_fingerprint_sql answers for the same rows."""
        digest = hashlib.md5(usedforsecurity=False)
        digest.update(bytes(self.row.checkpoint))
        digest.update(bytes(self.row.metadata or b""))
        for (task_id, idx), (_, _, channel, path, value) in sorted(
            self.writes.items(), key=lambda item: (compact_id(item[0][0]), item[0][1])
        ):
            digest.update(compact_id(task_id))
            digest.update(idx.to_bytes(4, "big", signed=True))
            digest.update(channel.encode())
            digest.update(path.encode())
            digest.update(bytes(value))
        return f"{len(self.blobs)}:{digest.hexdigest()}"


def latest_head_sql(thread_pk_column: str) -> dict[str, str]:
    """SQL for the thread's latest root checkpoint as get_tuple reads it, in
    three scalar subqueries an outer query on another table can carry (the
    worker's claim reads it with the run: DjangoSaver.adopt's `head`), each
    NULL if the thread has none: `checkpoint`, a bytea[] of its id, its
    parent's id, its blob versions (JSON text), its ciphertexts; `blobs` and
    `writes`, the arrays get_tuple's statement reads. Postgres only.
    `thread_pk_column`: the outer query's column holding the thread's id."""
    tables = _read_tables()
    latest = (
        f"FROM {tables.checkpoint} c WHERE c.thread_id = {thread_pk_column} "
        "AND c.checkpoint_ns = '' ORDER BY c.checkpoint_id DESC LIMIT 1"
    )
    return {
        "checkpoint": (
            "(SELECT ARRAY[c.checkpoint_id, c.parent_checkpoint_id, "
            "convert_to(c.blob_versions::text, 'UTF8'), c.checkpoint, c.metadata] "
            f"{latest})"
        ),
        "blobs": f"(SELECT {_BLOBS_OF_C} {latest})",
        "writes": f"(SELECT {_WRITES_OF_C} {latest})",
    }


def head_fingerprint_sql(thread_pk_column: str) -> str:
    """SQL for the fingerprint of the thread's latest root checkpoint as
    stored (_Head.fingerprint of the same rows), or NULL if it has none:
    its row's ciphertexts, its writes (key, columns and ciphertext, in key
    order) and how many of the blobs it names are stored. `thread_pk_column`:
    the outer query's column holding the thread's id."""
    tables = _read_tables()
    return (
        "(SELECT (SELECT count(*) FROM jsonb_each_text(c.blob_versions) AS used "
        f"WHERE EXISTS (SELECT 1 FROM {tables.blob} b WHERE b.thread_id = "
        "c.thread_id AND b.checkpoint_ns = c.checkpoint_ns AND b.channel = "
        "used.key AND b.version = used.value))::text || ':' || md5(c.checkpoint "
        "|| coalesce(c.metadata, ''::bytea) || coalesce((SELECT string_agg("
        "w.task_id || int4send(w.idx) || convert_to(w.channel, 'UTF8') || "
        "convert_to(w.task_path, 'UTF8') || w.value, ''::bytea ORDER BY "
        f"w.task_id, w.idx) FROM {tables.write} w WHERE w.thread_id = c.thread_id "
        "AND w.checkpoint_ns = c.checkpoint_ns AND w.checkpoint_id = "
        "c.checkpoint_id), ''::bytea)) "
        f"FROM {tables.checkpoint} c WHERE c.thread_id = {thread_pk_column} "
        "AND c.checkpoint_ns = '' ORDER BY c.checkpoint_id DESC LIMIT 1)"
    )


def _is_inline(value: Any) -> bool:
    if value is None or isinstance(value, (bool, int, float)):
        return True
    return isinstance(value, str) and len(value) <= INLINE_STR_MAX


def _contains(actual: Any, wanted: Any) -> bool:
    """Postgres's `jsonb @>`, which is what PostgresSaver's filter means."""
    if isinstance(wanted, dict):
        return isinstance(actual, dict) and all(
            key in actual and _contains(actual[key], value)
            for key, value in wanted.items()
        )
    if isinstance(wanted, (list, tuple)):
        if not isinstance(actual, (list, tuple)):
            return False
        return all(any(_contains(item, w) for item in actual) for w in wanted)
    if isinstance(wanted, bool) or isinstance(actual, bool):
        return type(actual) is type(wanted) and actual == wanted
    return actual == wanted


class DjangoSaver(BaseCheckpointSaver[str]):
    """A tenant's LangGraph checkpoints in the Gatehouse database, encrypted."""

    def __init__(
        self,
        *,
        tenant: Tenant,
        using: str | None = None,
        allowed_types: Iterable[tuple[str, ...] | type] = (),
    ) -> None:
        super().__init__(serde=StrictSerializer(allowed_types))
        if tenant is None or tenant.pk is None:
            raise ValueError("DjangoSaver needs a saved tenant")
        self.tenant = tenant
        self.using = using or DEFAULT_DB_ALIAS
        # thread_id -> (pk, cipher) of the thread row this saver wrote to.
        self._written_threads: dict[str, tuple[int, ThreadCipher]] = {}
        # The pks of the threads this saver created.
        self._created_threads: set[int] = set()
        # The pks of the threads it knows are marked `uses_delta_channels`.
        self._delta_threads: set[int] = set()
        # The ids of the threads adopted with no checkpoint (see adopt).
        self._empty_threads: set[str] = set()
        # thread id -> its latest root checkpoint as read with its run (adopt).
        self._read_heads: dict[str, tuple[_Row, dict, list]] = {}
        # thread pk -> (run id, lease owner) of the run its writes are for.
        self._leases: dict[int, tuple[Any, str]] = {}
        self._versions = VersionSequence()
        self._reset_heads()

    def _reset_heads(self) -> None:
        # The threads a worker adopted: pk -> (thread id, wrapped key, key id);
        # and what this saver last read or wrote of their namespaces (see
        # head). Shared with the allow-listed copies LangGraph writes through.
        self._remembered: dict[int, tuple[str, Any, str]] = {}
        self._heads: dict[tuple[int, str], _Head | None] = {}
        self._heads_lock = threading.Lock()
        # The tuple get_tuple answers for its thread's latest root checkpoint
        # (see answering), instead of reading it.
        self._answer: CheckpointTuple | None = None

    def with_allowlist(self, extra_allowlist: Iterable[tuple[str, ...]]) -> DjangoSaver:
        """LangGraph's hook for the types a graph's state declares."""
        serde = self.serde.with_allowlist(extra_allowlist)
        if serde is self.serde:
            return self
        clone = copy.copy(self)
        clone.serde = serde
        return clone

    def for_tenant(self, tenant: Tenant) -> DjangoSaver:
        """This saver, with its serializer and allow-list, bound to another tenant
        (how a compiled graph is reused across runs: see runs.graphs)."""
        if tenant is None or tenant.pk is None:
            raise ValueError("DjangoSaver needs a saved tenant")
        clone = copy.copy(self)
        clone.tenant = tenant
        clone._written_threads = {}
        clone._created_threads = set()
        clone._delta_threads = set()
        clone._empty_threads = set()
        clone._read_heads = {}
        clone._leases = {}
        clone._versions = VersionSequence()  # another tenant's: its own
        clone._reset_heads()
        return clone

    def adopt(
        self,
        thread: Thread,
        cipher: ThreadCipher,
        *,
        empty: bool = False,
        head: Sequence[Any] | None = None,
        lease: tuple[Any, str] | None = None,
    ) -> None:
        """Write to `thread` as if this saver had written to it already.

        For the worker that claimed a run: it read the thread alive, with its
        data key, under the thread's lock a moment before, so the first write
        need not look it up again in a transaction of its own. Every write
        still checks the thread alive in its statement (the late-write rule);
        one that finds it gone takes the transactional path, which refuses it
        (ThreadDeleted), as it refuses a thread deleted after any first write.

        `empty`: the claim read that the thread has no checkpoint, and none
        can be written but by this run (runs of a thread execute one at a
        time; the others that write checkpoints, a fork, a migration, need
        one already): the graph's first read of the thread's latest
        checkpoint answers None without a query (get_tuple), a round trip
        off every thread's first run.

        `head`: the thread's latest root checkpoint, as the claim read it with
        the run (latest_head_sql's three values, the first not NULL), under
        the same rule: nothing but the run can write a checkpoint to its
        thread meanwhile (a fork, a state update, a migration are refused
        while it is queued). The graph's first read of the thread's latest
        checkpoint answers it, decrypted as get_tuple decrypts its own read,
        without a query: a round trip off every run of a thread that has a
        checkpoint (a resume's included).

        `lease`: (run id, lease owner), the run the writes to the thread are
        for. Each write then also checks, in its statement, that the run is
        still `running` and held by that owner (Run.held), and one that
        finds it is not raises LeaseLost with nothing written (the
        late-write rule: a run taken over writes nothing more).
        """
        if thread.tenant_id != self.tenant.pk:
            raise ValueError("the thread belongs to another tenant")
        self._written_threads[str(thread.thread_id)] = (thread.pk, cipher)
        if lease is None:
            self._leases.pop(thread.pk, None)
        else:
            self._leases[thread.pk] = lease
        if empty:
            self._empty_threads.add(str(thread.thread_id))
        if head is not None:
            self._read_heads[str(thread.thread_id)] = _head_as_read(thread, *head)
        if thread.uses_delta_channels:
            self._delta_threads.add(thread.pk)
        if self._on_postgres:
            with self._heads_lock:
                self._remembered[thread.pk] = (
                    str(thread.thread_id),
                    thread.wrapped_data_key,
                    thread.data_key_id,
                )
                for key in [key for key in self._heads if key[0] == thread.pk]:
                    del self._heads[key]

    # --- the head: what a worker's run last read or wrote -------------------------
    #
    # At the end of a run its worker needs the thread's state (LangGraph's
    # get_state): reading back the checkpoint the run has just written cost a
    # round trip and the query's CPU. For an adopted thread (Postgres only),
    # the saver keeps the rows of its latest root checkpoint as it last read
    # them (LangGraph reads it when a run starts) or wrote them: a put makes
    # its checkpoint the head, with the blobs it uses; a put_writes to the
    # head adds its rows as the database keeps them (upserted, or inserted if
    # absent: a write that found any row in its place forgets the head, as
    # does every path other than the one-statement writes). head() decrypts
    # them through the code get_tuple's answer goes through. Whether the
    # database still holds exactly these rows is for the caller to check
    # (head_fingerprint_sql, in the statement that locks the run to record
    # it): nothing here can see another writer's rows.

    def head(self, thread_pk: int) -> tuple[CheckpointTuple, str] | None:
        """The adopted thread's root head as get_tuple would answer it, with
        its fingerprint; None if the saver has no complete copy of it."""
        ns = ROOT_NS
        with self._heads_lock:
            head = self._heads.get((thread_pk, ns))
            if head is None:
                return None
            writes = list(head.writes.values())
            blobs = {
                (thread_pk, ns, channel, version): value
                for (channel, version), value in head.blobs.items()
            }
            fingerprint = head.fingerprint()
            row = head.row
        return self._decrypt_tuple(row, blobs, writes), fingerprint

    def answering(self, saved: CheckpointTuple) -> DjangoSaver:
        """This saver, whose get_tuple answers `saved` for its thread's latest
        checkpoint of its namespace (a config without a checkpoint id), to
        build a state snapshot from a tuple already at hand (LangGraph's
        get_state takes its saver from the config's CONFIG_KEY_CHECKPOINTER)."""
        clone = copy.copy(self)
        clone._answer = saved
        return clone

    def _remember_read(self, row: _Row, blobs: dict, writes: list[tuple]) -> None:
        if row.ns != ROOT_NS or row.thread_pk not in self._remembered:
            return
        head = _Head(
            row=row,
            blobs={(key[2], key[3]): bytes(value) for key, value in blobs.items()},
            writes={(w[0], w[1]): (*w[:4], bytes(w[4])) for w in writes},
        )
        with self._heads_lock:
            self._heads[(row.thread_pk, row.ns)] = head

    def _remember_put(self, thread_pk: int, plan: _PutPlan, sealed: _SealedPut) -> None:
        if plan.ns != ROOT_NS or thread_pk not in self._remembered:
            return
        key = (thread_pk, plan.ns)
        with self._heads_lock:
            known = self._heads.get(key)
            stored = dict(known.blobs) if known is not None else {}
            for channel, version, value in sealed.blobs:
                # Unique to this saver (VersionSequence): never another's row.
                stored.setdefault((channel, version), value)
            blobs = {}
            for channel, version in plan.blob_versions.items():
                value = stored.get((channel, version))
                if value is None:  # stored before this run read or wrote it
                    self._heads[key] = None
                    return
                blobs[(channel, version)] = value
            thread_id, wrapped, key_id = self._remembered[thread_pk]
            checkpoint_id = id_text(compact_id(plan.checkpoint_id))
            writes = (
                known.writes
                if known is not None and known.row.checkpoint_id == checkpoint_id
                else {}  # the upsert of a checkpoint keeps its writes
            )
            row = _Row(
                thread_pk,
                thread_id,
                wrapped,
                key_id,
                plan.ns,
                checkpoint_id,
                id_text(compact_id(plan.parent_checkpoint_id)),
                plan.blob_versions,
                sealed.checkpoint,
                sealed.metadata,
            )
            self._heads[key] = _Head(row, blobs, writes)

    def _remember_writes(
        self,
        thread_pk: int,
        ns: str,
        checkpoint_id: str,
        task_id: str,
        rows: list[tuple[int, str, str, bytes]] | None,
    ) -> None:
        """`rows` each stored as given (upserted, or inserted where no row
        was), or None: what the database holds is not known."""
        if ns != ROOT_NS or thread_pk not in self._remembered:
            return
        key = (thread_pk, ns)
        with self._heads_lock:
            head = self._heads.get(key)
            if head is None or head.row.checkpoint_id != id_text(
                compact_id(checkpoint_id)
            ):
                return
            if rows is None:
                self._heads[key] = None
                return
            task = id_text(compact_id(task_id))
            # Every row stored (upserted, or inserted where none was): the
            # database's row of each key is this one.
            for idx, channel, path, value in rows:
                head.writes[(task, idx)] = (task, idx, channel, path, value)

    def get_next_version(self, current: str | int | None, channel: None) -> str:
        return self._versions.after(current)

    # --- threads ------------------------------------------------------------------

    def _threads(self):
        return Thread.objects.using(self.using).filter(tenant_id=self.tenant.pk)

    def _fetch_locked(self, queryset, fields: Sequence[str]) -> tuple | None:
        """The first row of `queryset`, locked FOR KEY SHARE on Postgres.

        KEY SHARE leaves concurrent writers of the same thread alone and
        conflicts only with FOR UPDATE (shredding, deleting, pruning).
        """
        connection = connections[self.using]
        query = queryset.values_list(*fields)[:1].query
        sql, params = query.get_compiler(self.using).as_sql()
        if connection.vendor == "postgresql":
            sql += " FOR KEY SHARE"
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchone()

    _THREAD_FIELDS = (
        "pk",
        "thread_id",
        "wrapped_data_key",
        "data_key_id",
        "deleted_at",
        "uses_delta_channels",
    )

    def _live_thread(self, row: tuple) -> _LiveThread:
        pk, thread_id, wrapped, key_id, deleted_at, uses_delta = row
        if deleted_at is not None:
            raise ThreadDeleted(
                f"thread {thread_id!r} was deleted; refusing a late write to it"
            )
        cipher = ThreadCipher.from_wrapped(
            tenant_id=self.tenant.pk,
            thread_pk=pk,
            wrapped=wrapped,
            key_id=key_id,
            label=repr(thread_id),
        )
        return _LiveThread(pk, thread_id, cipher, bool(uses_delta))

    def _thread_for_write(self, thread_id: str, *, delta: bool = False) -> _LiveThread:
        """The live thread a write goes to, locked; created if it never existed.
        `delta`: the write stores a DeltaChannel, so the thread is marked as
        using them (_mark_delta).

        Call inside the write's transaction.
        """
        pinned = self._written_threads.get(thread_id)
        if pinned is not None:
            row = self._fetch_locked(
                Thread.objects.using(self.using).filter(pk=pinned[0]),
                self._THREAD_FIELDS,
            )
            if row is not None:
                thread = self._live_thread(row)
                if delta:
                    # Its UPDATE before the run's lock, not after: a cancel
                    # or a takeover locks the thread (FOR NO KEY UPDATE),
                    # then the run; upgrading the thread's lock while
                    # holding the run's would close a cycle with them.
                    self._mark_delta(thread)
                self._hold_lease(thread)
                return thread
            if pinned[0] not in self._created_threads:
                raise ThreadDeleted(
                    f"thread {thread_id!r} was deleted; refusing a late write to it"
                )
            # Not visible: created by a write of this saver that has not
            # committed yet (LangGraph writes from several threads at once).
        live = self._threads().filter(thread_id=thread_id, deleted_at__isnull=True)
        row = self._fetch_locked(live, self._THREAD_FIELDS)
        created = False
        if row is None:
            tombstones = self._threads().filter(
                thread_id=thread_id, deleted_at__isnull=False
            )
            if tombstones.exists():
                raise ThreadDeleted(
                    f"thread {thread_id!r} was deleted; refusing a late write to "
                    "it (create the thread anew to reuse its id)"
                )
            row, created = self._create_thread(thread_id, live)
        thread = self._live_thread(row)
        if created:
            self._created_threads.add(thread.pk)
        if pinned is not None and thread.pk != pinned[0] and not created:
            raise ThreadDeleted(
                f"thread {thread_id!r} was deleted and its id given to a new "
                "thread; refusing a late write from the old one"
            )
        self._written_threads[thread_id] = (thread.pk, thread.cipher)
        if delta:
            self._mark_delta(thread)
        return thread

    def _hold_lease(self, thread: _LiveThread) -> None:
        """Lock the run the saver writes to `thread` for (FOR SHARE, after
        the thread: see _LEASED_THREAD), if it has one, and raise LeaseLost
        if it is no longer held. Call inside the write's transaction."""
        lease = self._leases.get(thread.pk)
        if lease is None:
            return
        sql = f"SELECT 1 FROM {Run._meta.db_table} r WHERE {LEASE_HELD_SQL}"
        connection = connections[self.using]
        if connection.vendor == "postgresql":
            sql += " FOR SHARE"
        run_id, owner = lease
        # As the database stores it (SQLite: the UUID's hex).
        run_id = Run._meta.pk.get_db_prep_value(run_id, connection)
        with connection.cursor() as cursor:
            cursor.execute(sql, [run_id, owner])
            if cursor.fetchone() is None:
                raise LeaseLost(
                    f"run {lease[0]} lost its lease; refusing its write to "
                    f"thread {thread.thread_id!r}"
                )

    def _create_thread(self, thread_id: str, live) -> tuple[tuple, bool]:
        try:
            with transaction.atomic(using=self.using):
                thread = Thread.objects.using(self.using).create_with_data_key(
                    tenant=self.tenant, thread_id=thread_id
                )
        except IntegrityError:
            # A concurrent first write created it; use theirs.
            row = self._fetch_locked(live, self._THREAD_FIELDS)
            if row is None:
                raise
            return row, False
        row = (
            thread.pk,
            thread.thread_id,
            thread.wrapped_data_key,
            thread.data_key_id,
            None,
            False,
        )
        return row, True

    def _mark_delta(self, thread: _LiveThread) -> None:
        if thread.uses_delta_channels:
            self._delta_threads.add(thread.pk)
            return
        Thread.objects.using(self.using).filter(pk=thread.pk).update(
            uses_delta_channels=True
        )
        transaction.on_commit(
            lambda: self._delta_threads.add(thread.pk), using=self.using
        )

    # --- writes -------------------------------------------------------------------
    #
    # The first write of a saver to a thread looks the thread up (creating it if
    # need be) in a transaction. Later writes to it are one statement on
    # Postgres, which locks the thread row FOR KEY SHARE and inserts only if the
    # thread is still alive; otherwise the transactional path runs and tells a
    # deleted thread (ThreadDeleted) from one not yet committed.

    def put(
        self,
        config: RunnableConfig,
        checkpoint: LangGraphCheckpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        configurable = config["configurable"]
        thread_id = str(configurable["thread_id"])
        ns = configurable.get("checkpoint_ns", "")
        checkpoint_id = checkpoint["id"]
        versions = checkpoint["channel_versions"]

        inline: dict[str, Any] = {}
        blob_values: dict[str, Any] = {}
        for channel, value in checkpoint["channel_values"].items():
            if _is_inline(value):
                inline[channel] = value
            elif channel in versions:
                blob_values[channel] = value
        body = {
            key: value
            for key, value in checkpoint.items()
            if key not in ("id", "channel_values")
        }
        body["channel_values"] = inline
        body["blob_channels"] = sorted(blob_values)
        if "ts" in body:
            body["ts"] = stored_ts(
                body["ts"], checkpoint_id, relative=not writes_earlier_format()
            )
        stored_metadata = get_serializable_checkpoint_metadata(config, metadata)
        step = stored_metadata.get("step")
        source = stored_metadata.get("source")
        run_id = stored_metadata.get("run_id")
        plan = _PutPlan(
            ns=ns,
            checkpoint_id=checkpoint_id,
            parent_checkpoint_id=configurable.get("checkpoint_id") or "",
            step=step if type(step) is int else None,
            source=source if isinstance(source, str) else "",
            run_id=str(run_id) if run_id is not None else "",
            body=body,
            metadata=stored_metadata,
            blobs=[
                (channel, str(version), blob_values[channel])
                for channel, version in new_versions.items()
                if channel in blob_values
            ],
            blob_versions={ch: str(versions[ch]) for ch in sorted(blob_values)},
            uses_delta=any(isinstance(v, _DeltaSnapshot) for v in blob_values.values())
            or any(key in stored_metadata for key in _DELTA_METADATA_KEYS),
        )
        self._empty_threads.discard(thread_id)  # see adopt
        self._read_heads.pop(thread_id, None)
        thread_connections.bind(self.using)
        outages.through_outages(
            lambda: self._put(thread_id, plan),
            what=f"checkpoint {checkpoint_id}",
            using=self.using,
        )
        return {
            "configurable": {
                "thread_id": thread_id,
                "checkpoint_ns": ns,
                "checkpoint_id": checkpoint_id,
            }
        }

    def _put(self, thread_id: str, plan: _PutPlan) -> None:
        # An upsert: repeated after a lost connection, it writes the same rows.
        known = self._written_threads.get(thread_id)
        if not (
            known is not None
            and self._on_postgres
            # The first delta checkpoint marks its thread (prune and migrate
            # refuse such threads): that takes the transactional path, once.
            and (not plan.uses_delta or known[0] in self._delta_threads)
            and self._put_in_one_statement(*known, plan)
        ):
            self._put_in_transaction(thread_id, plan)

    def _seal_put(self, cipher: ThreadCipher, plan: _PutPlan) -> _SealedPut:
        ns, checkpoint_id = plan.ns, plan.checkpoint_id
        return _SealedPut(
            checkpoint=cipher.encrypt_value(
                [plan.body, plan.metadata],
                row=(CHECKPOINT_WITH_METADATA, ns, checkpoint_id),
                serializer=self.serde,
            ),
            metadata=b"",
            blobs=[
                (
                    channel,
                    version,
                    cipher.encrypt_value(
                        value,
                        row=("blob", ns, channel, version),
                        serializer=self.serde,
                        # A snapshot: the whole list, written once per cadence.
                        compact=isinstance(value, _DeltaSnapshot),
                    ),
                )
                for channel, version, value in plan.blobs
            ],
        )

    def _put_in_transaction(self, thread_id: str, plan: _PutPlan) -> None:
        # Inside a caller's transaction, the rows may yet be rolled back.
        outer = connections[self.using].in_atomic_block
        with transaction.atomic(using=self.using):
            thread = self._thread_for_write(thread_id, delta=plan.uses_delta)
            sealed = self._seal_put(thread.cipher, plan)
            if sealed.blobs:
                ChannelBlob.objects.using(self.using).bulk_create(
                    [
                        ChannelBlob(
                            thread_id=thread.pk,
                            checkpoint_ns=plan.ns,
                            channel=channel,
                            version=version,
                            value=value,
                        )
                        for channel, version, value in sealed.blobs
                    ],
                    ignore_conflicts=True,
                )
            Checkpoint.objects.using(self.using).bulk_create(
                [
                    Checkpoint(
                        thread_id=thread.pk,
                        checkpoint_ns=plan.ns,
                        checkpoint_id=plan.checkpoint_id,
                        parent_checkpoint_id=plan.parent_checkpoint_id,
                        step=plan.step,
                        source=plan.source,
                        run_id=plan.run_id,
                        blob_versions=plan.blob_versions,
                        checkpoint=sealed.checkpoint,
                        metadata=sealed.metadata,
                    )
                ],
                update_conflicts=True,
                unique_fields=["thread", "checkpoint_ns", "checkpoint_id"],
                update_fields=[
                    "checkpoint",
                    "metadata",
                    "step",
                    "source",
                    "run_id",
                    "blob_versions",
                ],
            )
        if outer:
            with self._heads_lock:
                self._heads.pop((thread.pk, plan.ns), None)
        else:
            self._remember_put(thread.pk, plan, sealed)

    def _put_in_one_statement(
        self, thread_pk: int, cipher: ThreadCipher, plan: _PutPlan
    ) -> bool:
        sealed = self._seal_put(cipher, plan)
        lease = self._leases.get(thread_pk)
        # In the order of the placeholders of _put_statement.
        params: list[Any] = [thread_pk, *(lease or ())]
        if sealed.blobs:
            params.append(plan.ns)
        for channel, version, value in sealed.blobs:
            params += (channel, version, value)
        params += (
            plan.ns,
            compact_id(plan.checkpoint_id),
            compact_id(plan.parent_checkpoint_id),
            plan.step,
            plan.source,
            compact_id(plan.run_id),
            json.dumps(plan.blob_versions),
            sealed.checkpoint,
            sealed.metadata,
            timezone.now(),
        )
        statement = _put_statement(len(sealed.blobs), lease is not None)
        if not self._write_if_alive(statement, params):
            return False
        self._remember_put(thread_pk, plan, sealed)
        return True

    def _write_if_alive(self, sql: str, params: Sequence[Any]) -> bool:
        """Run a guarded write; False if the thread row was not found alive
        (or the run the write is for no longer held).

        Then nothing was written: the caller takes the transactional path,
        which tells a deleted thread from one whose creation has not
        committed yet (LangGraph writes from several threads at once), and
        a lost lease (LeaseLost).
        """
        return self._write_returning(sql, params)[0] == 1

    def _write_returning(self, sql: str, params: Sequence[Any]) -> tuple:
        """Run a guarded write; its answer (first, whether the thread is alive)."""
        connection = connections[self.using]
        connection.ensure_connection()
        with psycopg.Cursor(connection.connection) as cursor:
            cursor.execute(sql, params, prepare=True)
            return cursor.fetchone()

    @property
    def _on_postgres(self) -> bool:
        return connections[self.using].vendor == "postgresql"

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        if not writes:
            return
        configurable = config["configurable"]
        thread_id = str(configurable["thread_id"])
        ns = configurable.get("checkpoint_ns", "")
        checkpoint_id = configurable["checkpoint_id"]
        special = all(channel in WRITES_IDX_MAP for channel, _ in writes)
        indexed = [
            (WRITES_IDX_MAP.get(channel, position), channel, value)
            for position, (channel, value) in enumerate(writes)
        ]
        if special:
            # Upserted one after another, the last write of a channel wins;
            # one statement may not touch a row twice, so keep only that one.
            indexed = list({idx: (idx, ch, v) for idx, ch, v in indexed}.values())

        singles, packed = indexed, []
        if not special:
            singles = [write for write in indexed if write[0] < 0]
            packed = [write for write in indexed if write[0] >= 0]

        def seal(
            cipher: ThreadCipher, packed: list[tuple[int, str, Any]]
        ) -> list[tuple[int, str, str, bytes]]:
            """Rows as stored: (idx, channel, task path, ciphertext)."""
            rows = [
                (
                    idx,
                    channel,
                    task_path,
                    cipher.encrypt_value(
                        value,
                        row=_write_row(
                            ns, checkpoint_id, task_id, idx, channel, task_path
                        ),
                        serializer=self.serde,
                    ),
                )
                for idx, channel, value in singles
            ]
            if packed:
                idx = PACKED_WRITES_IDX + packed[0][0]
                items = [
                    [position, channel, self.serde.dumps(value)]
                    for position, channel, value in packed
                ]
                # The task path inside the ciphertext: a column of its own
                # would repeat it in clear on every step's row.
                rows.append(
                    (
                        idx,
                        "",
                        "",
                        cipher.encrypt_value(
                            [task_path, items],
                            row=_write_row(ns, checkpoint_id, task_id, idx, "", ""),
                            serializer=self.serde,
                        ),
                    )
                )
            return rows

        thread_connections.bind(self.using)
        outages.through_outages(
            lambda: self._put_writes(
                thread_id, ns, checkpoint_id, task_id, packed, special, seal
            ),
            what=f"writes of task {task_id}",
            using=self.using,
        )

    def _put_writes(
        self,
        thread_id: str,
        ns: str,
        checkpoint_id: str,
        task_id: str,
        packed: list[tuple[int, str, Any]],
        special: bool,
        seal: Callable[
            [ThreadCipher, list[tuple[int, str, Any]]],
            list[tuple[int, str, str, bytes]],
        ],
    ) -> None:
        # Upserts, or inserts that ignore rows already there: repeated after a
        # lost connection, they write the same rows.
        known = self._written_threads.get(thread_id)
        if known is not None and self._on_postgres:
            thread_pk, cipher = known
            lease = self._leases.get(thread_pk)
            params: list[Any] = [
                thread_pk,
                *(lease or ()),
                ns,
                compact_id(checkpoint_id),
                compact_id(task_id),
            ]
            sealed = seal(cipher, packed)
            for row in sealed:
                params += row
            statement = _put_writes_statement(len(sealed), special, lease is not None)
            alive, packed_rows, stored = self._write_returning(statement, params)
            if alive == 1 and (packed_rows or not packed):
                self._remember_writes(
                    thread_pk,
                    ns,
                    checkpoint_id,
                    task_id,
                    sealed if stored == len(sealed) else None,
                )
                return
            # Dead or not yet committed, or the run's lease lost (below tells
            # which), or the task's earlier call holds the packed row's
            # place: merged below.
        if known is not None:
            # What this path stores is not followed: the head is forgotten.
            self._remember_writes(known[0], ns, checkpoint_id, task_id, None)
        with transaction.atomic(using=self.using):
            thread = self._thread_for_write(thread_id)
            manager = PendingWrite.objects.using(self.using)
            if packed:
                packed = self._writes_not_stored(
                    thread, ns, checkpoint_id, task_id, packed
                )
            rows = [
                PendingWrite(
                    thread_id=thread.pk,
                    checkpoint_ns=ns,
                    checkpoint_id=checkpoint_id,
                    task_id=task_id,
                    idx=idx,
                    channel=channel,
                    task_path=stored_path,
                    value=value,
                )
                for idx, channel, stored_path, value in seal(thread.cipher, packed)
            ]
            if special:
                manager.bulk_create(
                    rows,
                    update_conflicts=True,
                    unique_fields=[
                        "thread",
                        "checkpoint_ns",
                        "checkpoint_id",
                        "task_id",
                        "idx",
                    ],
                    update_fields=["channel", "task_path", "value"],
                )
            else:
                manager.bulk_create(rows, ignore_conflicts=True)

    def _writes_not_stored(
        self,
        thread: _LiveThread,
        ns: str,
        checkpoint_id: str,
        task_id: str,
        packed: list[tuple[int, str, Any]],
    ) -> list[tuple[int, str, Any]]:
        """The regular writes whose positions the task's earlier calls did not
        store: PostgresSaver inserts each (task, idx) once, the first call's.

        Their packed row then starts at a position no stored row has, so its
        idx is free. Call inside the write's transaction.
        """
        stored = (
            PendingWrite.objects.using(self.using)
            .filter(
                thread_id=thread.pk,
                checkpoint_ns=ns,
                checkpoint_id=checkpoint_id,
                task_id=task_id,
                idx__gte=0,
            )
            .values_list("task_id", "idx", "channel", "task_path", "value")
        )
        positions = {
            position
            for _, position, _, _, _ in self._open_writes(
                thread.cipher, ns, checkpoint_id, stored
            )
        }
        return [write for write in packed if write[0] not in positions]

    # --- reads --------------------------------------------------------------------

    def _checkpoints(self):
        return Checkpoint.objects.using(self.using).filter(
            thread__tenant_id=self.tenant.pk, thread__deleted_at__isnull=True
        )

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """One query on Postgres: the checkpoint, its blobs and its writes."""
        configurable = config["configurable"]
        thread_id = str(configurable["thread_id"])
        if thread_id in self._empty_threads:
            # Only the first read, of the latest checkpoint (see adopt): any
            # later one may follow this saver's own writes.
            self._empty_threads.discard(thread_id)
            if not configurable.get("checkpoint_ns") and not get_checkpoint_id(config):
                return None
        read_head = self._read_heads.pop(thread_id, None)  # the first read only
        if (
            read_head is not None
            and not configurable.get("checkpoint_ns")
            and not get_checkpoint_id(config)
        ):
            row, blobs, writes = read_head
            if self._remembered:
                self._remember_read(row, blobs, writes)
            return self._decrypt_tuple(row, blobs, writes)
        thread_connections.bind(self.using)
        where = _thread_where()
        params: tuple = (
            self.tenant.pk,
            thread_id,
            configurable.get("checkpoint_ns", ""),
        )
        checkpoint_id = get_checkpoint_id(config)
        answer = self._answer
        if (
            answer is not None
            and not checkpoint_id
            and answer.config["configurable"]["thread_id"] == params[1]
            and answer.config["configurable"]["checkpoint_ns"] == params[2]
        ):
            return answer
        if checkpoint_id:
            where += " AND c.checkpoint_id = %s"
            params += (compact_id(checkpoint_id),)
        if self._on_postgres:
            rows = self._query([(_pg_get_tuple_statement(where), params)])[0]
            return self._tuple_of(rows)
        return self._get_tuple_in_steps(where, params)

    def _tuple_of(self, rows: list[tuple]) -> CheckpointTuple | None:
        """get_tuple's answer from the rows of `_pg_get_tuple_statement`."""
        if not rows:
            return None
        *checkpoint_row, stored_blobs, stored_writes = rows[0]
        row = _Row.from_sql(checkpoint_row)
        blobs = {
            (row.thread_pk, row.ns, channel.decode(), version.decode()): value
            for channel, version, value in stored_blobs or ()
        }
        writes = [
            (id_text(task_id), int(idx), channel.decode(), path.decode(), value)
            for task_id, idx, channel, path, value in stored_writes or ()
        ]
        if self._remembered:
            self._remember_read(row, blobs, writes)
        return self._decrypt_tuple(row, blobs, writes)

    def latest_after(
        self, thread_id: str, statement: tuple[str, Sequence[Any]]
    ) -> tuple[list[tuple], DjangoSaver]:
        """Run `statement` (a read, its SQL and parameters, its rows in text
        format as a Django cursor returns them), then read the thread's latest
        root checkpoint as get_tuple does: on Postgres, both in one round trip
        (a pipeline). Its rows, and this saver answering that checkpoint
        (`answering`) for a state snapshot of the thread; on another
        database, or a thread with no checkpoint, the rows and this saver,
        which reads the checkpoint when asked."""
        if not self._on_postgres:
            with connections[self.using].cursor() as cursor:
                cursor.execute(*statement)
                return cursor.fetchall(), self
        thread_connections.bind(self.using)
        where = _thread_where()
        params = (self.tenant.pk, str(thread_id), ROOT_NS)
        connection = connections[self.using]
        # `statement` through a Django cursor (logged, wrapped as any query),
        # the checkpoint's as get_tuple reads it; one Sync for both, sent when
        # the pipeline ends: Postgres runs them in order, each with its own
        # snapshot, as two statements. Their errors raised as Django's.
        with connection.cursor() as first:
            pgconn = connection.connection
            with psycopg.Cursor(pgconn) as head, connection.wrap_database_errors:
                with pgconn.pipeline():
                    first.execute(*statement)
                    head.execute(
                        _pg_get_tuple_statement(where),
                        params,
                        binary=True,
                        prepare=True,
                    )
                rows = first.fetchall()
                head_rows = head.fetchall()
        saved = self._tuple_of(head_rows)
        return rows, self if saved is None else self.answering(saved)

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """The writes and nearest stored value of DeltaChannels, in one query.

        LangGraph's default walks the parent chain one `get_tuple` at a time,
        loading every blob and write of every ancestor; here one statement
        walks it (`_pg_delta_history_statement`) and returns only the walked
        checkpoints, their writes to `channels` and each channel's seed blob.
        Other databases (SQLite, the embedded mode) take LangGraph's walk.
        """
        channels = list(dict.fromkeys(channels))
        if not channels:
            return {}
        if not self._on_postgres:
            return super().get_delta_channel_history(config=config, channels=channels)
        thread_connections.bind(self.using)
        configurable = config["configurable"]
        ns = configurable.get("checkpoint_ns", "")
        checkpoint_id = get_checkpoint_id(config)
        params = {
            "tenant": self.tenant.pk,
            "thread_id": str(configurable["thread_id"]),
            "ns": ns,
            "checkpoint_id": checkpoint_id,
            "channels": channels,
        }
        if checkpoint_id:
            params["checkpoint_id"] = compact_id(checkpoint_id)
        (stored_rows,) = self._query(
            [(_pg_delta_history_statement(not checkpoint_id), params)]
        )
        rows = [_delta_row(row) for row in stored_rows]
        thread = next((r for r in rows if r[0] == "t"), None)
        if thread is None:
            return {ch: {"writes": []} for ch in channels}
        _, _, thread_id, key_id, _, thread_pk, _, wrapped = thread
        cipher = self._cipher(
            SimpleNamespace(
                thread_pk=thread_pk, thread_id=thread_id, wrapped=wrapped, key_id=key_id
            )
        )
        chain = sorted((r for r in rows if r[0] == "c"), key=lambda r: r[1])
        seed_depth, seeds = self._delta_seeds(cipher, ns, chain, rows, channels)
        stored: dict[tuple[int, str], list[tuple]] = defaultdict(list)
        for kind, depth, cid, channel, task_id, idx, task_path, value in rows:
            if kind == "w":
                stored[(depth, cid)].append((task_id, idx, channel, task_path, value))
        writes: dict[str, list[tuple]] = {ch: [] for ch in channels}
        for (depth, cid), found in stored.items():
            wanted = {ch for ch in channels if depth <= seed_depth.get(ch, depth)}
            for task_id, idx, ch, task_path, value in self._open_writes(
                cipher, ns, cid, found, wanted
            ):
                writes[ch].append((depth, task_id, idx, task_path, value))
        history: dict[str, DeltaChannelHistory] = {}
        for ch in channels:
            # Oldest checkpoint first; inside one, the order live execution
            # applied its tasks' writes in (writes_sort_key).
            ordered = sorted(
                writes[ch],
                key=lambda w: (-w[0], writes_sort_key(w[3], w[1], w[2])),
            )
            entry: DeltaChannelHistory = {
                "writes": [(task_id, ch, value) for _, task_id, _, _, value in ordered]
            }
            if ch in seeds:
                entry["seed"] = seeds[ch]
            history[ch] = entry
        return history

    def _delta_seeds(
        self,
        cipher: ThreadCipher,
        ns: str,
        chain: list[tuple],
        rows: list[tuple],
        channels: list[str],
    ) -> tuple[dict[str, int], dict[str, Any]]:
        """Each channel's nearest stored value on the walked chain, and its depth.

        Read from the decrypted checkpoints, never from the plaintext map that
        steered the walk: an inline value counts, and a blob is decrypted under
        the version the checkpoint itself names.
        """
        blobs = {r[3]: (r[6], r[7]) for r in rows if r[0] == "b"}
        depth_of: dict[str, int] = {}
        seeds: dict[str, Any] = {}
        remaining = set(channels)
        for _, depth, cid, packed, _, _, _, stored in chain:
            if depth == 0:
                continue
            body, _ = self._open_checkpoint(
                cipher, ns, cid, stored, b"" if packed == "packed" else None
            )
            for ch in list(remaining):
                if ch in body["channel_values"]:
                    seeds[ch] = body["channel_values"][ch]
                elif ch in body["blob_channels"]:
                    version = str(body["channel_versions"][ch])
                    found_version, value = blobs.get(ch, (None, None))
                    if found_version != version:
                        raise crypto.TamperedCiphertext(
                            f"checkpoint {cid} needs channel {ch!r} at version "
                            f"{version}, which the store did not return"
                        )
                    seeds[ch] = cipher.decrypt_value(
                        value, row=("blob", ns, ch, version), serializer=self.serde
                    )
                else:
                    continue
                depth_of[ch] = depth
                remaining.discard(ch)
            if not remaining:
                break
        else:
            if remaining and chain and chain[-1][6]:
                # The walk stopped before the root without finding every seed:
                # the plaintext map claimed a blob the checkpoint does not use.
                raise crypto.TamperedCiphertext(
                    f"the ancestors of checkpoint {chain[0][2]} do not match "
                    "their stored blob versions"
                )
        return depth_of, seeds

    def _get_tuple_in_steps(self, where: str, params: tuple) -> CheckpointTuple | None:
        """The portable way: the checkpoint and its writes, then its blobs."""
        tables = _read_tables()
        latest = (
            f"FROM {tables.checkpoint} c WHERE {where} "
            "ORDER BY c.checkpoint_id DESC LIMIT 1"
        )
        checkpoint_sql = (
            f"SELECT {_ROW_COLUMNS} FROM {tables.checkpoint} c JOIN {tables.thread} "
            f"t ON t.id = c.thread_id WHERE {where} ORDER BY c.checkpoint_id DESC "
            "LIMIT 1"
        )
        writes_sql = (
            "SELECT w.task_id, w.idx, w.channel, w.task_path, w.value "
            f"FROM {tables.write} w WHERE (w.thread_id, w.checkpoint_ns, "
            "w.checkpoint_id) = (SELECT c.thread_id, c.checkpoint_ns, "
            f"c.checkpoint_id {latest})"
        )
        found, writes = self._query([(checkpoint_sql, params), (writes_sql, params)])
        if not found:
            return None
        row = _Row.from_sql(found[0])
        stored = []
        if versions := self._blob_versions(row):
            pairs = " OR ".join(["(channel = %s AND version = %s)"] * len(versions))
            blob_params: tuple = (row.thread_pk, row.ns)
            for channel, version in versions.items():
                blob_params += (channel, version)
            (stored,) = self._query(
                [
                    (
                        f"SELECT channel, version, value FROM {tables.blob} "
                        f"WHERE thread_id = %s AND checkpoint_ns = %s AND ({pairs})",
                        blob_params,
                    )
                ]
            )
        blobs = {
            (row.thread_pk, row.ns, channel, version): value
            for channel, version, value in stored
        }
        return self._decrypt_tuple(
            row, blobs, [(id_text(task_id), *rest) for task_id, *rest in writes]
        )

    def _blob_versions(self, row: _Row) -> dict[str, str]:
        stored = row.blob_versions
        return json.loads(stored) if isinstance(stored, str) else stored or {}

    def _decrypt_tuple(
        self,
        row: _Row,
        blobs: dict[tuple[int, str, str, str], bytes],
        writes: list[tuple],
    ) -> CheckpointTuple:
        cipher = self._cipher(row)
        body, metadata = self._open_checkpoint(
            cipher, row.ns, row.checkpoint_id, row.checkpoint, row.metadata
        )
        key = (row.thread_pk, row.ns, row.checkpoint_id)
        return self._build_tuple(row, cipher, body, metadata, blobs, {key: writes})

    def _query(self, statements: list[tuple[str, tuple]]) -> list[list[tuple]]:
        """Run read statements; on Postgres prepared, with binary results."""
        connection = connections[self.using]
        results = []
        if not self._on_postgres:
            with connection.cursor() as cursor:
                for sql, params in statements:
                    cursor.execute(sql, params)
                    results.append(cursor.fetchall())
            return results
        connection.ensure_connection()
        with psycopg.Cursor(connection.connection) as cursor:
            for sql, params in statements:
                # Prepared: planning these costs Postgres more than running them.
                cursor.execute(sql, params, binary=True, prepare=True)
                results.append(cursor.fetchall())
        return results

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        thread_connections.bind(self.using)
        queryset = self._checkpoints()
        if config:
            configurable = config["configurable"]
            if "thread_id" in configurable:
                # A subquery, not a join condition: the thread's checkpoints
                # then come from its index already in order.
                thread = self._threads().filter(
                    thread_id=str(configurable["thread_id"]), deleted_at__isnull=True
                )
                queryset = queryset.filter(thread_id=Subquery(thread.values("pk")[:1]))
            if (ns := configurable.get("checkpoint_ns")) is not None:
                queryset = queryset.filter(checkpoint_ns=ns)
            if checkpoint_id := get_checkpoint_id(config):
                queryset = queryset.filter(checkpoint_id=checkpoint_id)
        if filter:
            for key, kind in _COLUMN_FILTERS.items():
                value = filter.get(key)
                if type(value) is kind:
                    queryset = queryset.filter(**{key: value})
        if before is not None and (before_id := get_checkpoint_id(before)):
            queryset = queryset.filter(checkpoint_id__lt=before_id)
        queryset = queryset.order_by("-checkpoint_id").values_list(*_CHECKPOINT_FIELDS)
        if limit is not None and not filter:
            queryset = queryset[: int(limit)]
        remaining = int(limit) if limit is not None else None
        if remaining is not None and remaining <= 0:
            return
        chunk: list[_Row] = []
        for values in queryset.iterator(chunk_size=_LIST_CHUNK):
            chunk.append(_Row(*values))
            if len(chunk) < _LIST_CHUNK:
                continue
            for item in self._load_tuples(chunk, filter):
                yield item
                if remaining is not None:
                    remaining -= 1
                    if remaining == 0:
                        return
            chunk = []
        for item in self._load_tuples(chunk, filter):
            yield item
            if remaining is not None:
                remaining -= 1
                if remaining == 0:
                    return

    def _cipher(self, row: _Row) -> ThreadCipher:
        return ThreadCipher.from_wrapped(
            tenant_id=self.tenant.pk,
            thread_pk=row.thread_pk,
            wrapped=row.wrapped,
            key_id=row.key_id,
            label=repr(row.thread_id),
        )

    def _load_tuples(
        self, rows: Sequence[_Row], filter: dict[str, Any] | None = None
    ) -> list[CheckpointTuple]:
        """Decrypt checkpoint rows; their blobs and writes in two queries."""
        if not rows:
            return []
        ciphers: dict[int, ThreadCipher] = {}
        loaded = []
        for row in rows:
            cipher = ciphers.get(row.thread_pk)
            if cipher is None:
                cipher = ciphers[row.thread_pk] = self._cipher(row)
            body, metadata = self._open_checkpoint(
                cipher, row.ns, row.checkpoint_id, row.checkpoint, row.metadata
            )
            if filter and not _contains(metadata, filter):
                continue
            loaded.append((row, cipher, body, metadata))
        if not loaded:
            return []

        wanted: dict[tuple[int, str], tuple[set[str], set[str]]] = defaultdict(
            lambda: (set(), set())
        )
        checkpoint_ids: dict[tuple[int, str], set[str]] = defaultdict(set)
        for row, _, body, _ in loaded:
            channels, versions = wanted[(row.thread_pk, row.ns)]
            for channel in body["blob_channels"]:
                channels.add(channel)
                versions.add(str(body["channel_versions"][channel]))
            checkpoint_ids[(row.thread_pk, row.ns)].add(row.checkpoint_id)

        blobs: dict[tuple[int, str, str, str], bytes] = {}
        blob_filter = Q()
        for (thread_pk, ns), (channels, versions) in wanted.items():
            if channels:
                blob_filter |= Q(
                    thread_id=thread_pk,
                    checkpoint_ns=ns,
                    channel__in=channels,
                    version__in=versions,
                )
        if blob_filter:
            for thread_pk, ns, channel, version, value in (
                ChannelBlob.objects.using(self.using)
                .filter(blob_filter)
                .values_list(
                    "thread_id", "checkpoint_ns", "channel", "version", "value"
                )
            ):
                blobs[(thread_pk, ns, channel, version)] = value

        writes: dict[tuple[int, str, str], list[tuple]] = defaultdict(list)
        write_filter = Q()
        for (thread_pk, ns), ids in checkpoint_ids.items():
            write_filter |= Q(
                thread_id=thread_pk, checkpoint_ns=ns, checkpoint_id__in=ids
            )
        for write in (
            PendingWrite.objects.using(self.using)
            .filter(write_filter)
            .values_list(
                "thread_id",
                "checkpoint_ns",
                "checkpoint_id",
                "task_id",
                "idx",
                "channel",
                "task_path",
                "value",
            )
        ):
            writes[write[:3]].append(write[3:])

        return [
            self._build_tuple(row, cipher, body, metadata, blobs, writes)
            for row, cipher, body, metadata in loaded
        ]

    def _open_checkpoint(
        self,
        cipher: ThreadCipher,
        ns: str,
        checkpoint_id: str,
        checkpoint: bytes | memoryview,
        metadata: bytes | memoryview | None,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """A checkpoint row's body and metadata: one ciphertext (`metadata`
        empty), or two (rows written before they were packed together)."""
        if metadata is not None and len(metadata) == 0:
            body, stored_metadata = cipher.decrypt_value(
                checkpoint,
                row=(CHECKPOINT_WITH_METADATA, ns, checkpoint_id),
                serializer=self.serde,
            )
        else:
            body = cipher.decrypt_value(
                checkpoint, row=("checkpoint", ns, checkpoint_id), serializer=self.serde
            )
            stored_metadata = (
                {}
                if metadata is None
                else cipher.decrypt_value(
                    metadata, row=("metadata", ns, checkpoint_id), serializer=self.serde
                )
            )
        if "ts" in body:
            body["ts"] = read_ts(body["ts"], checkpoint_id)
        return body, stored_metadata

    def _open_writes(
        self,
        cipher: ThreadCipher,
        ns: str,
        checkpoint_id: str,
        stored: Iterable[tuple],
        channels: set[str] | None = None,
    ) -> list[tuple[str, int, str, str, Any]]:
        """A checkpoint's stored write rows (task id, idx, channel, task path,
        ciphertext), decrypted: (task id, idx, channel, task path, value).

        A packed row (idx at or over PACKED_WRITES_IDX) gives its writes, each
        with its own idx; a single row of the same task and idx (an upsert of
        a special channel) wins over a packed one. `channels`: only those.
        """
        singles: dict[tuple[str, int], tuple] = {}
        single_keys: set[tuple[str, int]] = set()
        packed: list[tuple] = []
        for task_id, idx, channel, task_path, value in stored:
            idx = int(idx)
            if idx < PACKED_WRITES_IDX:
                single_keys.add((task_id, idx))
                if channels is None or channel in channels:
                    singles[(task_id, idx)] = (
                        task_id,
                        idx,
                        channel,
                        task_path,
                        cipher.decrypt_value(
                            value,
                            row=_write_row(
                                ns, checkpoint_id, task_id, idx, channel, task_path
                            ),
                            serializer=self.serde,
                        ),
                    )
                continue
            items = cipher.decrypt_value(
                value,
                row=_write_row(ns, checkpoint_id, task_id, idx, "", task_path),
                serializer=self.serde,
            )
            if isinstance(items[0], str):
                # [task path, items]; rows written before hold the items alone.
                task_path, items = items
            for position, channel, data in items:
                if channels is None or channel in channels:
                    packed.append(
                        (task_id, position, channel, task_path, self.serde.loads(data))
                    )
        return [
            *singles.values(),
            *(w for w in packed if (w[0], w[1]) not in single_keys),
        ]

    def _build_tuple(
        self,
        row: _Row,
        cipher: ThreadCipher,
        body: dict[str, Any],
        metadata: dict[str, Any],
        blobs: dict[tuple[int, str, str, str], bytes],
        writes: dict[tuple[int, str, str], list[tuple]],
    ) -> CheckpointTuple:
        channel_values = body.pop("channel_values")
        for channel in body.pop("blob_channels"):
            version = str(body["channel_versions"][channel])
            stored = blobs.get((row.thread_pk, row.ns, channel, version))
            if stored is None:
                raise crypto.TamperedCiphertext(
                    f"checkpoint {row.checkpoint_id} of thread {row.thread_id!r} "
                    f"needs channel {channel!r} at version {version}, which is "
                    "missing from the store"
                )
            channel_values[channel] = cipher.decrypt_value(
                stored, row=("blob", row.ns, channel, version), serializer=self.serde
            )
        pending = sorted(
            self._open_writes(
                cipher,
                row.ns,
                row.checkpoint_id,
                writes.get((row.thread_pk, row.ns, row.checkpoint_id), ()),
            ),
            key=lambda w: writes_sort_key(w[3], w[0], w[1]),
        )
        pending_writes = [
            (task_id, channel, value) for task_id, _, channel, _, value in pending
        ]
        checkpoint = {**body, "id": row.checkpoint_id, "channel_values": channel_values}
        return CheckpointTuple(
            config={
                "configurable": {
                    "thread_id": row.thread_id,
                    "checkpoint_ns": row.ns,
                    "checkpoint_id": row.checkpoint_id,
                }
            },
            checkpoint=checkpoint,
            metadata=metadata,
            parent_config=(
                {
                    "configurable": {
                        "thread_id": row.thread_id,
                        "checkpoint_ns": row.ns,
                        "checkpoint_id": row.parent_checkpoint_id,
                    }
                }
                if row.parent_checkpoint_id
                else None
            ),
            pending_writes=pending_writes,
        )

    # --- deletion, copying, pruning: the work is runs.storage's ---------------------

    def delete_thread(self, thread_id: str) -> None:
        """Destroy every thread of the tenant stored under this id (the live one
        and any tombstone that still has rows): `runs.storage.thread_destroy`."""
        thread_connections.bind(self.using)
        with transaction.atomic(using=self.using):
            for thread in storage.threads_lock(
                self._threads().filter(thread_id=str(thread_id))
            ):
                storage.thread_destroy(thread=thread, using=self.using)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        run_ids = [str(run_id) for run_id in run_ids]
        if not run_ids:
            return
        thread_connections.bind(self.using)
        # The caller's list has no cap: every filter on it goes in batches.
        run_batches = list(storage.id_batches(run_ids, using=self.using))
        with transaction.atomic(using=self.using):
            thread_pks = {
                thread_pk
                for batch in run_batches
                for thread_pk in self._checkpoints()
                .filter(run_id__in=batch)
                .values_list("thread_id", flat=True)
                .distinct()
            }
            locked = self._lock_live_threads(sorted(thread_pks))
            doomed: dict[tuple[int, str], list[str]] = defaultdict(list)
            for batch in run_batches:
                for thread_pk, ns, checkpoint_id in (
                    Checkpoint.objects.using(self.using)
                    .filter(thread__tenant_id=self.tenant.pk, run_id__in=batch)
                    .values_list("thread_id", "checkpoint_ns", "checkpoint_id")
                ):
                    if thread_pk in locked:
                        doomed[(thread_pk, ns)].append(checkpoint_id)
            for (thread_pk, ns), checkpoint_ids in doomed.items():
                storage.checkpoints_delete(
                    thread_pk=thread_pk,
                    ns=ns,
                    checkpoint_ids=checkpoint_ids,
                    using=self.using,
                )

    def _lock_live_threads(self, thread_pks: list[int]) -> set[int]:
        """Lock this tenant's live threads among `thread_pks` (sorted, so the
        batches lock in pk order as one statement would); their pks."""
        locked: set[int] = set()
        for batch in storage.id_batches(thread_pks, using=self.using):
            threads = storage.threads_lock(
                self._threads().filter(pk__in=batch, deleted_at__isnull=True)
            )
            locked.update(thread.pk for thread in threads)
        return locked

    def _live_thread_pks(self, thread_ids: list[str]) -> list[int]:
        """The pks of this tenant's live threads among `thread_ids`, sorted."""
        pks: list[int] = []
        for batch in storage.id_batches(thread_ids, using=self.using):
            pks.extend(
                self._threads()
                .filter(thread_id__in=batch, deleted_at__isnull=True)
                .values_list("pk", flat=True)
            )
        return sorted(pks)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint, blob and write, re-encrypted for the target."""
        thread_connections.bind(self.using)
        source_thread_id = str(source_thread_id)
        target_thread_id = str(target_thread_id)
        with transaction.atomic(using=self.using):
            row = self._fetch_locked(
                self._threads().filter(
                    thread_id=source_thread_id, deleted_at__isnull=True
                ),
                self._THREAD_FIELDS,
            )
            if row is None:
                return
            source = self._live_thread(row)
            target = self._thread_for_write(target_thread_id)
            if source.pk == target.pk:
                return
            self._copy_rows(source, target)
            if source.uses_delta_channels:
                self._mark_delta(target)
            agent = (
                Thread.objects.using(self.using)
                .filter(pk=source.pk)
                .values("agent_name", "agent_version")
                .get()
            )
            Thread.objects.using(self.using).filter(pk=target.pk, agent_name="").update(
                **agent
            )

    def _copy_rows(self, source: _LiveThread, target: _LiveThread) -> None:
        def reseal(value: bytes, row: tuple) -> bytes:
            return target.cipher.encrypt(source.cipher.decrypt(value, row=row), row=row)

        def copy_model(model, fields: Sequence[str], row_of, sealed: Sequence[str]):
            batch = []
            for values in (
                model.objects.using(self.using)
                .filter(thread_id=source.pk)
                .values(*fields)
                .iterator(chunk_size=_BATCH)
            ):
                row = row_of(values)
                for name in sealed:
                    if model is not Checkpoint:
                        kind = row[0]
                    elif not values["metadata"]:
                        # Packed with its metadata; the empty column stays so.
                        if name == "metadata":
                            continue
                        kind = CHECKPOINT_WITH_METADATA
                    else:
                        kind = name
                    values[name] = reseal(values[name], (kind, *row[1:]))
                batch.append(model(thread_id=target.pk, **values))
                if len(batch) == _BATCH:
                    model.objects.using(self.using).bulk_create(
                        batch, ignore_conflicts=True
                    )
                    batch = []
            if batch:
                model.objects.using(self.using).bulk_create(
                    batch, ignore_conflicts=True
                )

        copy_model(
            Checkpoint,
            (
                "checkpoint_ns",
                "checkpoint_id",
                "parent_checkpoint_id",
                "step",
                "source",
                "run_id",
                "blob_versions",
                "checkpoint",
                "metadata",
                "created_at",
            ),
            lambda v: ("", v["checkpoint_ns"], v["checkpoint_id"]),
            ("checkpoint", "metadata"),
        )
        copy_model(
            ChannelBlob,
            ("checkpoint_ns", "channel", "version", "value"),
            lambda v: ("blob", v["checkpoint_ns"], v["channel"], v["version"]),
            ("value",),
        )
        copy_model(
            PendingWrite,
            (
                "checkpoint_ns",
                "checkpoint_id",
                "task_id",
                "idx",
                "channel",
                "task_path",
                "value",
            ),
            lambda v: _write_row(
                v["checkpoint_ns"],
                v["checkpoint_id"],
                v["task_id"],
                v["idx"],
                v["channel"],
                v["task_path"],
            ),
            ("value",),
        )

    def prune(
        self, thread_ids: Sequence[str], *, strategy: str = "keep_latest"
    ) -> None:
        """`keep_latest` keeps each namespace's latest checkpoint; `delete` all.

        Mirrors PostgresSaver: a subgraph call's namespace goes with the root
        checkpoint it started from once that one is pruned; threads that use a
        DeltaChannel are refused by `keep_latest`. The thread stays alive
        either way (deleting a thread is `delete_thread`).
        """
        if isinstance(thread_ids, str):
            raise TypeError("thread_ids must be a sequence of thread IDs, not a str")
        if strategy not in PRUNE_STRATEGIES:
            raise ValueError(f"Unknown prune strategy: {strategy!r}")
        thread_ids = [str(thread_id) for thread_id in thread_ids]
        if not thread_ids:
            return
        thread_connections.bind(self.using)
        # The caller's list has no cap: every filter on it goes in batches.
        live = self._live_thread_pks(thread_ids)
        if strategy == "delete":
            with transaction.atomic(using=self.using):
                locked = self._lock_live_threads(live)
                for batch in storage.id_batches(sorted(locked), using=self.using):
                    storage.content_delete(thread_pks=batch, using=self.using)
            return
        if delta := sorted(
            thread_id
            for batch in storage.id_batches(live, using=self.using)
            for thread_id in self._threads()
            .filter(pk__in=batch, uses_delta_channels=True)
            .values_list("thread_id", flat=True)
        ):
            raise NotImplementedError(
                "keep_latest can't prune threads that use a DeltaChannel: "
                + ", ".join(delta)
            )
        for pk in live:
            with transaction.atomic(using=self.using):
                threads = storage.threads_lock(
                    Thread.objects.using(self.using).filter(
                        pk=pk, deleted_at__isnull=True
                    )
                )
                if threads:
                    self._keep_latest(threads[0])

    def _keep_latest(self, thread: Thread) -> None:
        if thread.uses_delta_channels:
            raise NotImplementedError(
                "keep_latest can't prune threads that use a DeltaChannel: "
                + thread.thread_id
            )
        if thread.wrapped_data_key is None:
            # Shredded: its rows are about to go with it, and cannot be read.
            return
        checkpoints = Checkpoint.objects.using(self.using).filter(thread=thread)
        # Each namespace's latest, one index step each (Postgres has no max()
        # of the bytes the ids are stored as).
        heads = {
            ns: checkpoints.filter(checkpoint_ns=ns)
            .order_by("-checkpoint_id")
            .values_list("checkpoint_id", flat=True)
            .first()
            for ns in checkpoints.order_by()
            .values_list("checkpoint_ns", flat=True)
            .distinct()
        }
        cipher = ThreadCipher.for_thread(thread)
        calls = []
        for ns, head in heads.items():
            # A subgraph call's namespace has its task id after a ":".
            if ":" not in ns:
                continue
            stored = checkpoints.values_list("checkpoint", "metadata").get(
                checkpoint_ns=ns, checkpoint_id=head
            )
            _, metadata = self._open_checkpoint(cipher, ns, head, *stored)
            root = (metadata.get("parents") or {}).get("")
            if (
                root
                and root != heads.get("")
                and checkpoints.filter(checkpoint_ns="", checkpoint_id=root).exists()
            ):
                calls.append(ns)
        if calls:
            storage.content_delete(
                thread_pks=[thread.pk], namespaces=calls, using=self.using
            )
        storage.checkpoints_prune(thread_pks=[thread.pk], keep=1, using=self.using)

    # --- async: the same work, off the event loop ---------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await sync_to_async(self.get_tuple)(config)

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        return await sync_to_async(self.get_delta_channel_history)(
            config=config, channels=channels
        )

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        def collect() -> list[CheckpointTuple]:
            return list(self.list(config, filter=filter, before=before, limit=limit))

        for item in await sync_to_async(collect)():
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: LangGraphCheckpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return await sync_to_async(self.put)(config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await sync_to_async(self.put_writes)(config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await sync_to_async(self.delete_thread)(thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await sync_to_async(self.delete_for_runs)(run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await sync_to_async(self.copy_thread)(source_thread_id, target_thread_id)

    async def aprune(
        self, thread_ids: Sequence[str], *, strategy: str = "keep_latest"
    ) -> None:
        await sync_to_async(self.prune)(thread_ids, strategy=strategy)


def _write_row(
    ns: str, checkpoint_id: str, task_id: str, idx: int, channel: str, task_path: str
) -> tuple:
    """The associated data of a pending-write row: one write, or a packed row
    (idx at or over PACKED_WRITES_IDX) of a call's writes."""
    if idx >= PACKED_WRITES_IDX:
        return ("writes", ns, checkpoint_id, task_id, idx, task_path)
    return ("write", ns, checkpoint_id, task_id, idx, channel, task_path)
