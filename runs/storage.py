"""Thread content at rest: the one place that shreds, deletes and prunes it, and
that rewraps the data keys guarding it.

Every path that removes what a thread stored comes here: the checkpoint
saver's LangGraph methods (`delete_thread`, `delete_for_runs`, `prune`),
retention (expiry, deletion requests, the pruning job) and
`manage.py rotate_master_key`. Nothing else deletes a checkpoint, a channel
blob or a pending write, or changes a data key once created.

- Shredding (`threads_shred`) destroys the threads' data keys and makes their
  rows tombstones, in one UPDATE: everything they stored is unreadable at
  once, in every later copy of the database too, and the checkpoint store
  refuses any late write to them (`runs.crypto.ThreadDeleted`). A thread under
  legal hold is never shredded (`ThreadUnderLegalHold`), whoever asks;
  tenant-wide holds are retention's, which checks them before it calls here.
- Deleting (`content_delete`, `checkpoints_delete`) removes checkpoints, their
  pending writes, and the channel blobs no remaining checkpoint uses; a kept
  checkpoint whose parent went has no parent any more.
- Pruning (`checkpoints_prune`) keeps the latest N checkpoints of each
  namespace of a thread and deletes the rest that way.
- Clearing (`content_clear`) empties what other models keep of the threads
  (run inputs, tool results, approval payloads, reviewer cards, ...): each
  model declares its content (`runs.models.ThreadContent`), and this module
  finds the declarations through the app registry, so it clears the content
  of apps that runs does not import.
- `thread_destroy` is shredding and deleting for one thread, by row (a new thread that has
  taken the client's id since is not touched).

Locks: the callers hold the threads' rows FOR UPDATE (`threads_lock`, or their
own batch query), which waits for writes in flight (FOR KEY SHARE, see
runs.checkpointer) and makes later writes wait, then find the thread dead.
"""

from __future__ import annotations

import sys
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.apps import apps
from django.db import DEFAULT_DB_ALIAS, connections, migrations, transaction
from django.db.models import Count, DateTimeField, F, Q, Value, Window
from django.db.models.functions import Coalesce, RowNumber
from django.utils import timezone

from runs import crypto
from runs.models import (
    ChannelBlob,
    Checkpoint,
    PendingWrite,
    Thread,
    ThreadContent,
    WrappedKey,
)

_BATCH = 500
# What each content table's rows are called in the counts callers report.
_CONTENT_TABLES = (
    (PendingWrite, "pending_writes"),
    (ChannelBlob, "channel_blobs"),
    (Checkpoint, "checkpoints"),
)


class ThreadUnderLegalHold(Exception):
    """A thread under legal hold may not be shredded."""


def threads_lock(queryset) -> list[Thread]:
    """The threads of `queryset`, locked FOR UPDATE in pk order, so that two
    operations on overlapping threads never deadlock."""
    return list(queryset.select_for_update(of=("self",)).order_by("pk"))


# Ids of a caller's list per `__in` filter: far under the parameters one
# statement takes (65535 on Postgres with server-side binding, config.postgresql).
_IDS_PER_FILTER = 10_000


def id_batches(ids: Sequence, *, using: str | None = None) -> Iterator[list]:
    """`ids` in lists that each fit one `__in` filter on the database `using`.

    A list from a caller (LangGraph's `delete_for_runs` and `prune`) has no
    cap, and an `__in` filter takes one parameter per id: past the
    database's limit the statement fails, on Postgres and SQLite alike. Half
    the limit leaves room for the statement's other parameters.
    """
    limit = connections[using or DEFAULT_DB_ALIAS].features.max_query_params
    size = min(_IDS_PER_FILTER, limit // 2) if limit else _IDS_PER_FILTER
    ids = list(ids)
    for start in range(0, len(ids), size):
        yield ids[start : start + size]


# --- shredding -------------------------------------------------------------------


def threads_shred(
    *,
    thread_pks: Sequence[int],
    using: str | None = None,
    clear_metadata: bool = False,
) -> None:
    """Destroy the threads' data keys and make them tombstones. Idempotent.

    Call with the threads locked. Raises ThreadUnderLegalHold, changing
    nothing, if one of them is held. The metadata and the subject's blind
    index stay unless `clear_metadata` (a subject's deletion request finds its
    threads by that index until their rows are removed).
    """
    db = using or DEFAULT_DB_ALIAS
    threads = Thread.objects.using(db).filter(pk__in=list(thread_pks))
    held = sorted(threads.filter(legal_hold=True).values_list("thread_id", flat=True))
    if held:
        raise ThreadUnderLegalHold(
            f"thread {', '.join(held)} is under legal hold; release the hold "
            "before deleting it"
        )
    now = Value(timezone.now(), output_field=DateTimeField())
    fields: dict[str, Any] = {
        "wrapped_data_key": None,
        "data_key_id": "",
        "deleted_at": Coalesce(F("deleted_at"), now),
    }
    if clear_metadata:
        fields.update(metadata={}, subject_hash="")
    threads.update(**fields)

    def forget() -> None:
        for pk in thread_pks:
            crypto.forget_data_key(pk)

    # Now for this process; after the commit again, in case a read in between
    # cached the key that the commit destroys.
    forget()
    transaction.on_commit(forget, using=db)


# --- deleting ----------------------------------------------------------------------


def content_delete(
    *,
    thread_pks: Sequence[int],
    using: str | None = None,
    namespaces: Sequence[str] | None = None,
) -> dict[int, Counter]:
    """Delete the threads' checkpoints, blobs and writes (of `namespaces` only,
    if given). Returns {thread pk: rows deleted by kind}."""
    db = using or DEFAULT_DB_ALIAS
    removed: dict[int, Counter] = defaultdict(Counter)
    for model, name in _CONTENT_TABLES:
        for thread_pk, rows in _delete_rows(model, thread_pks, namespaces, db):
            removed[thread_pk][name] += rows
    return removed


def _delete_rows(model, thread_pks, namespaces, db) -> Iterable[tuple[int, int]]:
    """(thread pk, rows deleted): one statement on Postgres."""
    connection = connections[db]
    if connection.vendor == "postgresql":
        table = connection.ops.quote_name(model._meta.db_table)
        sql = f"DELETE FROM {table} WHERE thread_id = ANY(%s)"
        params: list[Any] = [list(thread_pks)]
        if namespaces is not None:
            sql += " AND checkpoint_ns = ANY(%s)"
            params.append(list(namespaces))
        with connection.cursor() as cursor:
            cursor.execute(
                f"WITH gone AS ({sql} RETURNING thread_id) "
                "SELECT thread_id, count(*) FROM gone GROUP BY thread_id",
                params,
            )
            return cursor.fetchall()
    rows = model.objects.using(db).filter(thread_id__in=thread_pks)
    if namespaces is not None:
        rows = rows.filter(checkpoint_ns__in=namespaces)
    counts = list(
        rows.values("thread_id")
        .annotate(rows=Count("*"))
        .values_list("thread_id", "rows")
        .order_by()
    )
    rows.delete()
    return counts


def declared_content() -> list[tuple[type, ThreadContent]]:
    """Every installed model's thread content declarations."""
    return [
        (model, content)
        for model in apps.get_models()
        for content in getattr(model, "thread_content", ())
    ]


def content_clear(
    *, thread_pks: Sequence[int], using: str | None = None
) -> dict[int, Counter]:
    """Clear (or, for content rows, delete) what every model declares of the
    threads' content. Returns {thread pk: rows cleared by declaration name}."""
    db = using or DEFAULT_DB_ALIAS
    cleared: dict[int, Counter] = defaultdict(Counter)
    for model, content in declared_content():
        rows = model.objects.using(db).filter(**{f"{content.thread}__in": thread_pks})
        if content.fields:
            rows = rows.filter(_has_any(content))
        counts = dict(
            rows.values(content.thread)
            .annotate(rows=Count("pk"))
            .values_list(content.thread, "rows")
            .order_by()
        )
        if not counts:
            continue
        for thread_pk, count in counts.items():
            cleared[thread_pk][content.name] += count
        if content.fields:
            # The rows as a subquery, not a list of their keys: a long-lived
            # thread's rows outnumber the parameters a statement may take.
            model.objects.using(db).filter(pk__in=rows.values("pk")).update(
                **dict.fromkeys(content.fields, content.empty)
            )
        else:
            rows.delete()
    return cleared


def _has_any(content: ThreadContent) -> Q:
    """Rows with something left to clear in one of the content's fields."""
    has = Q()
    for name in content.fields:
        if content.empty is None:
            has |= Q(**{f"{name}__isnull": False})
        else:
            has |= ~Q(**{name: content.empty})
    return has


def checkpoints_delete(
    *,
    thread_pk: int,
    ns: str,
    checkpoint_ids: Sequence[str],
    using: str | None = None,
) -> Counter:
    """Delete checkpoints of one namespace and their writes, then the blobs no
    remaining checkpoint uses. Returns the rows deleted by kind."""
    db = using or DEFAULT_DB_ALIAS
    removed: Counter = Counter()
    for start in range(0, len(checkpoint_ids), _BATCH):
        batch = checkpoint_ids[start : start + _BATCH]
        for model, name in (
            (PendingWrite, "pending_writes"),
            (Checkpoint, "checkpoints"),
        ):
            deleted, _ = (
                model.objects.using(db)
                .filter(thread_id=thread_pk, checkpoint_ns=ns, checkpoint_id__in=batch)
                .delete()
            )
            removed[name] += deleted
        # A parent that is gone is no parent: history ends at the kept ones.
        Checkpoint.objects.using(db).filter(
            thread_id=thread_pk, checkpoint_ns=ns, parent_checkpoint_id__in=batch
        ).update(parent_checkpoint_id="")
    removed["channel_blobs"] += blobs_collect(thread_pk=thread_pk, ns=ns, using=db)
    return removed


def blobs_collect(*, thread_pk: int, ns: str, using: str | None = None) -> int:
    """Delete the namespace's blobs that no remaining checkpoint uses."""
    db = using or DEFAULT_DB_ALIAS
    used: set[tuple[str, str]] = set()
    for versions in (
        Checkpoint.objects.using(db)
        .filter(thread_id=thread_pk, checkpoint_ns=ns)
        .values_list("blob_versions", flat=True)
        .iterator(chunk_size=_BATCH)
    ):
        used.update(versions.items())
    garbage = [
        pk
        for pk, channel, version in ChannelBlob.objects.using(db)
        .filter(thread_id=thread_pk, checkpoint_ns=ns)
        .values_list("pk", "channel", "version")
        if (channel, version) not in used
    ]
    for start in range(0, len(garbage), _BATCH):
        ChannelBlob.objects.using(db).filter(
            pk__in=garbage[start : start + _BATCH]
        ).delete()
    return len(garbage)


def checkpoints_prune(
    *, thread_pks: Sequence[int], keep: int, using: str | None = None
) -> dict[int, Counter]:
    """Keep the latest `keep` checkpoints of each thread and namespace.

    The latest checkpoint, with its pending writes (interrupts, resume values,
    completed tasks) and the blobs it uses, always stays, so an interrupted
    thread resumes exactly as before. Call with the threads locked, none with
    a queued or running run and none using DeltaChannels (whose history is the
    value). Returns {thread pk: rows deleted by kind}.
    """
    if keep < 1:
        raise ValueError("keep at least the latest checkpoint")
    db = using or DEFAULT_DB_ALIAS
    doomed: dict[tuple[int, str], list[str]] = defaultdict(list)
    for thread_pk, ns, checkpoint_id in (
        Checkpoint.objects.using(db)
        .filter(thread_id__in=list(thread_pks))
        .annotate(
            rank=Window(
                RowNumber(),
                partition_by=[F("thread_id"), F("checkpoint_ns")],
                order_by=F("checkpoint_id").desc(),
            )
        )
        .filter(rank__gt=keep)
        .values_list("thread_id", "checkpoint_ns", "checkpoint_id")
    ):
        doomed[(thread_pk, ns)].append(checkpoint_id)
    removed: dict[int, Counter] = defaultdict(Counter)
    for (thread_pk, ns), checkpoint_ids in doomed.items():
        removed[thread_pk] += checkpoints_delete(
            thread_pk=thread_pk, ns=ns, checkpoint_ids=checkpoint_ids, using=db
        )
    return removed


def thread_destroy(*, thread: Thread, using: str | None = None) -> Counter:
    """Shred the thread, clear its metadata, delete its checkpoints, blobs and
    writes, and leave its row as a tombstone that refuses late writes.

    By row, not by id. Idempotent; ThreadUnderLegalHold under legal hold.
    Returns the rows deleted by kind.
    """
    db = using or thread._state.db or DEFAULT_DB_ALIAS
    with transaction.atomic(using=db):
        threads_lock(Thread.objects.using(db).filter(pk=thread.pk))
        threads_shred(thread_pks=[thread.pk], using=db, clear_metadata=True)
        removed = content_delete(thread_pks=[thread.pk], using=db)
    thread.wrapped_data_key = None
    thread.data_key_id = ""
    return removed[thread.pk]


# --- rewrapping data keys (master key rotation) ------------------------------------


@dataclass
class RotationSummary:
    key_id: str
    rewrapped: int = 0
    already_current: int = 0
    shredded: int = 0
    # Locked by a deletion in progress every time they came up: rerun.
    busy: int = 0
    # Wrapped by a master key that is no longer in the ring.
    unreadable: dict[str, int] = field(default_factory=dict)
    rewrapped_by_tenant: dict[int, int] = field(default_factory=dict)
    # Other keys that models declare (runs.models.WrappedKey), by model label.
    rewrapped_other: dict[str, int] = field(default_factory=dict)


def data_keys_rotate(
    *,
    batch_size: int = 500,
    using: str | None = None,
    on_progress: Callable[[int], None] | None = None,
    passes: int = 3,
) -> RotationSummary:
    """Rewrap every data key not under the active master key; no content changes.

    Works in batches, each in its own transaction, taking the threads' rows
    FOR NO KEY UPDATE SKIP LOCKED: writers (FOR KEY SHARE) carry on meanwhile,
    since a rewrapped key is the same key, and threads being shredded are
    skipped for a later pass. Safe to interrupt and to rerun.
    """
    db = using or DEFAULT_DB_ALIAS
    ring = crypto.keyring()
    threads = Thread.objects.using(db)
    summary = RotationSummary(key_id=ring.active_id)
    summary.shredded = threads.filter(wrapped_data_key__isnull=True).count()
    summary.already_current = threads.filter(
        wrapped_data_key__isnull=False, data_key_id=ring.active_id
    ).count()
    pending = threads.filter(wrapped_data_key__isnull=False).exclude(
        data_key_id=ring.active_id
    )
    unreadable_pks: set[int] = set()
    for _ in range(passes):
        last_pk = 0
        while True:
            with transaction.atomic(using=db):
                batch = list(
                    pending.filter(pk__gt=last_pk)
                    .exclude(pk__in=unreadable_pks)
                    .order_by("pk")
                    .select_for_update(no_key=True, skip_locked=True)
                    .only("pk", "tenant_id", "wrapped_data_key", "data_key_id")[
                        :batch_size
                    ]
                )
                if not batch:
                    break
                changed = []
                for thread in batch:
                    if thread.data_key_id not in ring.keys:
                        unreadable_pks.add(thread.pk)
                        summary.unreadable[thread.data_key_id] = (
                            summary.unreadable.get(thread.data_key_id, 0) + 1
                        )
                        continue
                    rewrapped = crypto.rewrap_data_key(
                        wrapped=bytes(thread.wrapped_data_key),
                        key_id=thread.data_key_id,
                        tenant_id=thread.tenant_id,
                        owner=crypto.thread_key_owner(thread.pk),
                    )
                    thread.wrapped_data_key = rewrapped.wrapped
                    thread.data_key_id = rewrapped.key_id
                    changed.append(thread)
                    summary.rewrapped_by_tenant[thread.tenant_id] = (
                        summary.rewrapped_by_tenant.get(thread.tenant_id, 0) + 1
                    )
                threads.bulk_update(changed, ["wrapped_data_key", "data_key_id"])
                summary.rewrapped += len(changed)
                last_pk = batch[-1].pk
            if on_progress is not None:
                on_progress(len(batch))
        if not pending.exclude(pk__in=unreadable_pks).exists():
            break
    summary.busy = pending.exclude(pk__in=unreadable_pks).count()
    summary.rewrapped_other = _declared_keys_rotate(ring, db)
    return summary


def _declared_keys_rotate(ring: crypto.KeyRing, db: str) -> dict[str, int]:
    """Rewrap the keys other models declare (a webhook subscription's signing
    key): few rows, one transaction per model."""
    rewrapped: dict[str, int] = {}
    for model in apps.get_models():
        for key in getattr(model, "wrapped_keys", ()):
            rows = (
                model.objects.using(db)
                .exclude(**{key.key_id: ring.active_id})
                .filter(**{f"{key.key_id}__in": list(ring.keys)})
            )
            with transaction.atomic(using=db):
                for row in rows.select_for_update(of=("self",), no_key=True):
                    new = crypto.rewrap_data_key(
                        wrapped=bytes(getattr(row, key.wrapped)),
                        key_id=getattr(row, key.key_id),
                        tenant_id=getattr(row, key.tenant),
                        owner=key.owner_of(row),
                    )
                    setattr(row, key.wrapped, new.wrapped)
                    setattr(row, key.key_id, new.key_id)
                    row.save(update_fields=[key.wrapped, key.key_id])
                    label = model._meta.label
                    rewrapped[label] = rewrapped.get(label, 0) + 1
    return rewrapped


def legacy_wraps_upgrade(
    rows, *, key: WrappedKey, batch_size: int = 500
) -> dict[str, int]:
    """Bind every key wrapped in the format before wraps named their row to
    its row (runs.crypto.rewrap_data_key), under the active master key.

    `rows` is a queryset of the model holding the wrapped keys `key` declares
    (a migration passes its historical model's). Returns {"upgraded": n,
    "missing_key": n}: a key whose master key is not in the ring cannot be
    read, and stays as it is until that key is back in the ring and
    `rotate_master_key` runs.
    """
    ring = crypto.keyring()
    counts = {"upgraded": 0, "missing_key": 0}
    rows = rows.filter(**{f"{key.wrapped}__isnull": False}).order_by("pk")
    fields = [key.wrapped, key.key_id]
    batch = list(rows.only("pk", key.tenant, *fields)[:batch_size])
    while batch:
        changed = []
        for row in batch:
            blob = bytes(getattr(row, key.wrapped))
            if not crypto.is_legacy_wrap(blob):
                continue
            if getattr(row, key.key_id) not in ring.keys:
                counts["missing_key"] += 1
                continue
            new = crypto.rewrap_data_key(
                wrapped=blob,
                key_id=getattr(row, key.key_id),
                tenant_id=getattr(row, key.tenant),
                owner=key.owner_of(row),
            )
            setattr(row, key.wrapped, new.wrapped)
            setattr(row, key.key_id, new.key_id)
            changed.append(row)
        rows.model._default_manager.using(rows.db).bulk_update(changed, fields)
        counts["upgraded"] += len(changed)
        after = rows.filter(pk__gt=batch[-1].pk)
        batch = list(after.only("pk", key.tenant, *fields)[:batch_size])
    return counts


def legacy_wraps_migration(model: str, key: WrappedKey, what: str):
    """The migration operation that runs `legacy_wraps_upgrade` over `model`
    ("app_label.Model"), saying how many `what` it could not read."""

    def bind(apps, schema_editor) -> None:
        rows = apps.get_model(model).objects.using(schema_editor.connection.alias)
        missing = legacy_wraps_upgrade(rows, key=key)["missing_key"]
        if missing:
            # A migration has no other channel to the operator running it.
            sys.stdout.write(
                f"\n  {missing} {what} are wrapped by a master key not in "
                "GATEHOUSE_MASTER_KEYS and were left as they are: put the key "
                "back in the ring and run `manage.py rotate_master_key`.\n"
            )

    # Going back leaves the keys bound: the older format is not written again.
    return migrations.RunPython(bind, migrations.RunPython.noop)
