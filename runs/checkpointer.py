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
"""

from __future__ import annotations

import copy
import random
import threading
from collections import defaultdict
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async
from django.db import DEFAULT_DB_ALIAS, IntegrityError, connections, transaction
from django.db.models import Max, Q
from django.utils import timezone
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_serializable_checkpoint_metadata,
    writes_sort_key,
)
from langgraph.checkpoint.base import Checkpoint as LangGraphCheckpoint
from langgraph.checkpoint.serde.types import _DeltaSnapshot

from runs import crypto
from runs.crypto import ThreadCipher, ThreadDeleted
from runs.models import ChannelBlob, Checkpoint, PendingWrite, Tenant, Thread
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

_CHECKPOINT_FIELDS = (
    "thread_id",
    "thread__thread_id",
    "thread__wrapped_data_key",
    "thread__data_key_id",
    "checkpoint_ns",
    "checkpoint_id",
    "parent_checkpoint_id",
    "checkpoint",
    "metadata",
)


@dataclass(frozen=True)
class _Row:
    """A checkpoint row as `_CHECKPOINT_FIELDS` selects it."""

    thread_pk: int
    thread_id: str
    wrapped: bytes | memoryview | None
    key_id: str
    ns: str
    checkpoint_id: str
    parent_checkpoint_id: str
    checkpoint: bytes | memoryview
    metadata: bytes | memoryview


@dataclass(frozen=True)
class _LiveThread:
    pk: int
    thread_id: str
    cipher: ThreadCipher
    uses_delta_channels: bool


class _HeldConnection:
    """A worker thread's connection, closed when the thread lets go of it."""

    def __init__(self, wrapper) -> None:
        self.wrapper = wrapper

    def __del__(self) -> None:
        # Runs as the thread ends; psycopg's own close works from any thread.
        if self.wrapper.connection is not None:
            self.wrapper.connection.close()


_thread_connections = threading.local()


def _bind_thread_connection(alias: str) -> None:
    """Reuse the thread's connection in a fresh copy of a context.

    LangGraph runs `put` and `put_writes` on executor threads, each call in a
    new copy of the caller's context, where Django finds no connection and
    opens one per call. Here the first one is kept for the thread (and closed
    with it) and handed to the later calls.
    """
    if any(c.alias == alias for c in connections.all(initialized_only=True)):
        return
    held = getattr(_thread_connections, alias, None)
    if held is None:
        setattr(_thread_connections, alias, _HeldConnection(connections[alias]))
    else:
        connections[alias] = held.wrapper


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
        # thread_id -> pk of the thread row this saver wrote to.
        self._written_threads: dict[str, int] = {}

    def with_allowlist(self, extra_allowlist: Iterable[tuple[str, ...]]) -> DjangoSaver:
        """LangGraph's hook for the types a graph's state declares."""
        serde = self.serde.with_allowlist(extra_allowlist)
        if serde is self.serde:
            return self
        clone = copy.copy(self)
        clone.serde = serde
        return clone

    def get_next_version(self, current: str | int | None, channel: None) -> str:
        # PostgresSaver's scheme: a counter, then a random tie-breaker.
        if current is None:
            current_v = 0
        elif isinstance(current, int):
            current_v = current
        else:
            current_v = int(current.split(".")[0])
        return f"{current_v + 1:032}.{random.random():016}"

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

    def _thread_for_write(self, thread_id: str) -> _LiveThread:
        """The live thread a write goes to, locked; created if it never existed.

        Call inside the write's transaction.
        """
        pinned = self._written_threads.get(thread_id)
        if pinned is not None:
            row = self._fetch_locked(
                Thread.objects.using(self.using).filter(pk=pinned), self._THREAD_FIELDS
            )
            if row is None:
                raise ThreadDeleted(
                    f"thread {thread_id!r} was deleted; refusing a late write to it"
                )
            return self._live_thread(row)
        live = self._threads().filter(thread_id=thread_id, deleted_at__isnull=True)
        row = self._fetch_locked(live, self._THREAD_FIELDS)
        if row is None:
            tombstones = self._threads().filter(
                thread_id=thread_id, deleted_at__isnull=False
            )
            if tombstones.exists():
                raise ThreadDeleted(
                    f"thread {thread_id!r} was deleted; refusing a late write to "
                    "it (create the thread anew to reuse its id)"
                )
            row = self._create_thread(thread_id, live)
        thread = self._live_thread(row)
        self._written_threads[thread_id] = thread.pk
        return thread

    def _create_thread(self, thread_id: str, live) -> tuple:
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
            return row
        return (
            thread.pk,
            thread.thread_id,
            thread.wrapped_data_key,
            thread.data_key_id,
            None,
            False,
        )

    def _mark_delta(self, thread: _LiveThread) -> None:
        if not thread.uses_delta_channels:
            Thread.objects.using(self.using).filter(pk=thread.pk).update(
                uses_delta_channels=True
            )

    # --- writes -------------------------------------------------------------------

    def put(
        self,
        config: RunnableConfig,
        checkpoint: LangGraphCheckpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        _bind_thread_connection(self.using)
        configurable = config["configurable"]
        thread_id = str(configurable["thread_id"])
        ns = configurable.get("checkpoint_ns", "")
        parent_id = configurable.get("checkpoint_id")
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
        stored_metadata = get_serializable_checkpoint_metadata(config, metadata)
        uses_delta = any(
            isinstance(v, _DeltaSnapshot) for v in blob_values.values()
        ) or any(key in stored_metadata for key in _DELTA_METADATA_KEYS)
        step = stored_metadata.get("step")
        source = stored_metadata.get("source")
        run_id = stored_metadata.get("run_id")

        with transaction.atomic(using=self.using):
            thread = self._thread_for_write(thread_id)
            cipher = thread.cipher
            blobs = [
                ChannelBlob(
                    thread_id=thread.pk,
                    checkpoint_ns=ns,
                    channel=channel,
                    version=str(version),
                    value=cipher.encrypt_value(
                        blob_values[channel],
                        row=("blob", ns, channel, str(version)),
                        serializer=self.serde,
                    ),
                )
                for channel, version in new_versions.items()
                if channel in blob_values
            ]
            if blobs:
                ChannelBlob.objects.using(self.using).bulk_create(
                    blobs, ignore_conflicts=True
                )
            row = Checkpoint(
                thread_id=thread.pk,
                checkpoint_ns=ns,
                checkpoint_id=checkpoint_id,
                parent_checkpoint_id=parent_id or "",
                step=step if type(step) is int else None,
                source=source if isinstance(source, str) else "",
                run_id=str(run_id) if run_id is not None else "",
                checkpoint=cipher.encrypt_value(
                    body, row=("checkpoint", ns, checkpoint_id), serializer=self.serde
                ),
                metadata=cipher.encrypt_value(
                    stored_metadata,
                    row=("metadata", ns, checkpoint_id),
                    serializer=self.serde,
                ),
            )
            Checkpoint.objects.using(self.using).bulk_create(
                [row],
                update_conflicts=True,
                unique_fields=["thread", "checkpoint_ns", "checkpoint_id"],
                update_fields=["checkpoint", "metadata", "step", "source", "run_id"],
            )
            if uses_delta:
                self._mark_delta(thread)
        return {
            "configurable": {
                "thread_id": thread_id,
                "checkpoint_ns": ns,
                "checkpoint_id": checkpoint_id,
            }
        }

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        if not writes:
            return
        _bind_thread_connection(self.using)
        configurable = config["configurable"]
        thread_id = str(configurable["thread_id"])
        ns = configurable.get("checkpoint_ns", "")
        checkpoint_id = configurable["checkpoint_id"]
        special = all(channel in WRITES_IDX_MAP for channel, _ in writes)
        with transaction.atomic(using=self.using):
            thread = self._thread_for_write(thread_id)
            rows = []
            for position, (channel, value) in enumerate(writes):
                idx = WRITES_IDX_MAP.get(channel, position)
                rows.append(
                    PendingWrite(
                        thread_id=thread.pk,
                        checkpoint_ns=ns,
                        checkpoint_id=checkpoint_id,
                        task_id=task_id,
                        idx=idx,
                        channel=channel,
                        task_path=task_path,
                        value=thread.cipher.encrypt_value(
                            value,
                            row=_write_row(
                                ns, checkpoint_id, task_id, idx, channel, task_path
                            ),
                            serializer=self.serde,
                        ),
                    )
                )
            manager = PendingWrite.objects.using(self.using)
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

    # --- reads --------------------------------------------------------------------

    def _checkpoints(self):
        return Checkpoint.objects.using(self.using).filter(
            thread__tenant_id=self.tenant.pk, thread__deleted_at__isnull=True
        )

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        _bind_thread_connection(self.using)
        configurable = config["configurable"]
        queryset = self._checkpoints().filter(
            thread__thread_id=str(configurable["thread_id"]),
            checkpoint_ns=configurable.get("checkpoint_ns", ""),
        )
        if checkpoint_id := get_checkpoint_id(config):
            queryset = queryset.filter(checkpoint_id=checkpoint_id)
        else:
            queryset = queryset.order_by("-checkpoint_id")
        rows = [
            _Row(*values) for values in queryset.values_list(*_CHECKPOINT_FIELDS)[:1]
        ]
        if not rows:
            return None
        return self._load_tuples(rows)[0]

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        _bind_thread_connection(self.using)
        queryset = self._checkpoints()
        if config:
            configurable = config["configurable"]
            if "thread_id" in configurable:
                queryset = queryset.filter(
                    thread__thread_id=str(configurable["thread_id"])
                )
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
            metadata = cipher.decrypt_value(
                row.metadata,
                row=("metadata", row.ns, row.checkpoint_id),
                serializer=self.serde,
            )
            if filter and not _contains(metadata, filter):
                continue
            body = cipher.decrypt_value(
                row.checkpoint,
                row=("checkpoint", row.ns, row.checkpoint_id),
                serializer=self.serde,
            )
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
            writes.get((row.thread_pk, row.ns, row.checkpoint_id), ()),
            key=lambda w: writes_sort_key(w[3], w[0], w[1]),
        )
        pending_writes = [
            (
                task_id,
                channel,
                cipher.decrypt_value(
                    value,
                    row=_write_row(
                        row.ns, row.checkpoint_id, task_id, idx, channel, task_path
                    ),
                    serializer=self.serde,
                ),
            )
            for task_id, idx, channel, task_path, value in pending
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

    # --- deletion, copying, pruning -------------------------------------------------

    def _lock_threads(self, queryset) -> list[Thread]:
        # Ordered, so two operations on overlapping threads do not deadlock.
        return list(queryset.select_for_update().order_by("pk"))

    def _delete_content(self, thread_pks: Sequence[int], **where: Any) -> None:
        for model in (PendingWrite, ChannelBlob, Checkpoint):
            model.objects.using(self.using).filter(
                thread_id__in=thread_pks, **where
            ).delete()

    def delete_thread(self, thread_id: str) -> None:
        """Shred the thread's key, delete its content, keep a tombstone."""
        _bind_thread_connection(self.using)
        with transaction.atomic(using=self.using):
            threads = self._lock_threads(
                self._threads().filter(
                    thread_id=str(thread_id), deleted_at__isnull=True
                )
            )
            for thread in threads:
                crypto.shred_thread(thread=thread, using=self.using)
                Thread.objects.using(self.using).filter(pk=thread.pk).update(
                    deleted_at=timezone.now(), metadata={}, subject_hash=""
                )
            self._delete_content([thread.pk for thread in threads])

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        run_ids = [str(run_id) for run_id in run_ids]
        if not run_ids:
            return
        _bind_thread_connection(self.using)
        with transaction.atomic(using=self.using):
            thread_pks = (
                self._checkpoints()
                .filter(run_id__in=run_ids)
                .values_list("thread_id", flat=True)
                .distinct()
            )
            threads = self._lock_threads(
                self._threads().filter(pk__in=list(thread_pks), deleted_at__isnull=True)
            )
            if not threads:
                return
            doomed: dict[tuple[int, str], list[str]] = defaultdict(list)
            for thread_pk, ns, checkpoint_id in (
                Checkpoint.objects.using(self.using)
                .filter(thread__in=threads, run_id__in=run_ids)
                .values_list("thread_id", "checkpoint_ns", "checkpoint_id")
            ):
                doomed[(thread_pk, ns)].append(checkpoint_id)
            by_pk = {thread.pk: thread for thread in threads}
            for (thread_pk, ns), checkpoint_ids in doomed.items():
                self._delete_checkpoints(by_pk[thread_pk], ns, checkpoint_ids)

    def _delete_checkpoints(
        self, thread: Thread, ns: str, checkpoint_ids: Sequence[str]
    ) -> None:
        """Delete checkpoints and their writes, then the blobs left unused."""
        for start in range(0, len(checkpoint_ids), _BATCH):
            batch = checkpoint_ids[start : start + _BATCH]
            for model in (PendingWrite, Checkpoint):
                model.objects.using(self.using).filter(
                    thread=thread, checkpoint_ns=ns, checkpoint_id__in=batch
                ).delete()
        doomed = set(checkpoint_ids)
        # A parent that is gone is no parent: history ends at the kept ones.
        Checkpoint.objects.using(self.using).filter(
            thread=thread, checkpoint_ns=ns, parent_checkpoint_id__in=doomed
        ).update(parent_checkpoint_id="")
        self._collect_blobs(thread, ns)

    def _collect_blobs(self, thread: Thread, ns: str) -> None:
        """Delete the namespace's blobs that no remaining checkpoint uses."""
        if thread.wrapped_data_key is None:
            return
        cipher = ThreadCipher.for_thread(thread)
        used: set[tuple[str, str]] = set()
        for checkpoint_id, stored in (
            Checkpoint.objects.using(self.using)
            .filter(thread=thread, checkpoint_ns=ns)
            .values_list("checkpoint_id", "checkpoint")
            .iterator(chunk_size=_BATCH)
        ):
            body = cipher.decrypt_value(
                stored, row=("checkpoint", ns, checkpoint_id), serializer=self.serde
            )
            versions = body["channel_versions"]
            used.update((ch, str(versions[ch])) for ch in body["blob_channels"])
        garbage = [
            pk
            for pk, channel, version in ChannelBlob.objects.using(self.using)
            .filter(thread=thread, checkpoint_ns=ns)
            .values_list("pk", "channel", "version")
            if (channel, version) not in used
        ]
        for start in range(0, len(garbage), _BATCH):
            ChannelBlob.objects.using(self.using).filter(
                pk__in=garbage[start : start + _BATCH]
            ).delete()

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint, blob and write, re-encrypted for the target."""
        _bind_thread_connection(self.using)
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
                    kind = name if model is Checkpoint else row[0]
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
        _bind_thread_connection(self.using)
        live = self._threads().filter(thread_id__in=thread_ids, deleted_at__isnull=True)
        if strategy == "delete":
            with transaction.atomic(using=self.using):
                threads = self._lock_threads(live)
                self._delete_content([thread.pk for thread in threads])
            return
        if delta := sorted(
            live.filter(uses_delta_channels=True).values_list("thread_id", flat=True)
        ):
            raise NotImplementedError(
                "keep_latest can't prune threads that use a DeltaChannel: "
                + ", ".join(delta)
            )
        for pk in live.order_by("pk").values_list("pk", flat=True):
            with transaction.atomic(using=self.using):
                threads = self._lock_threads(
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
        heads = dict(
            checkpoints.values("checkpoint_ns")
            .annotate(head=Max("checkpoint_id"))
            .values_list("checkpoint_ns", "head")
        )
        cipher = ThreadCipher.for_thread(thread)
        calls = []
        for ns, head in heads.items():
            # A subgraph call's namespace has its task id after a ":".
            if ":" not in ns:
                continue
            stored = checkpoints.get(checkpoint_ns=ns, checkpoint_id=head).metadata
            metadata = cipher.decrypt_value(
                stored, row=("metadata", ns, head), serializer=self.serde
            )
            root = (metadata.get("parents") or {}).get("")
            if (
                root
                and root != heads.get("")
                and checkpoints.filter(checkpoint_ns="", checkpoint_id=root).exists()
            ):
                calls.append(ns)
        if calls:
            self._delete_content([thread.pk], checkpoint_ns__in=calls)
        for ns, head in heads.items():
            if ns in calls:
                continue
            unkept = list(
                checkpoints.filter(checkpoint_ns=ns)
                .exclude(checkpoint_id=head)
                .values_list("checkpoint_id", flat=True)
            )
            if unkept:
                self._delete_checkpoints(thread, ns, unkept)

    # --- async: the same work, off the event loop ---------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await sync_to_async(self.get_tuple)(config)

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
    return ("write", ns, checkpoint_id, task_id, idx, channel, task_path)
