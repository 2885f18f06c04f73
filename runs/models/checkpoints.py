"""LangGraph's checkpoints, as `runs.checkpointer.DjangoSaver` stores them.

Plaintext columns hold structure only (ids, namespaces, channel names,
versions, steps); every value is ciphertext from `runs.crypto.ThreadCipher`,
bound to its row. The thread foreign keys carry no index of their own: each
table's primary or unique key starts with the thread.

Checkpoint, task and run ids are `CompactIdField`s: LangGraph's ids are UUIDs, kept
in their 16 bytes instead of 36 characters (in the rows and in the keys that
lead with them).
"""

import re
import uuid

from django.db import models
from django.db.models import Q
from django.utils import timezone

from runs.models.threads import Thread

_CANONICAL_UUID = re.compile(
    r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z"
)


def compact_id(value: str) -> bytes:
    """An id as stored: a UUID in its canonical form (lowercase, hyphenated) as
    its 16 bytes; any other id as UTF-8 ending in one NUL (two where one would
    make 16 bytes, the length that means a UUID); "" as no bytes.

    Bytewise order is the text's order among UUIDs (hex digits in place) and
    among other ids (the NUL sorts first), which is what "latest checkpoint"
    and `list(before=...)` rely on; LangGraph's checkpoint ids are UUIDs.
    """
    if not value:
        return b""
    if len(value) == 36 and _CANONICAL_UUID.match(value):
        return uuid.UUID(value).bytes
    if "\0" in value:
        raise ValueError(f"an id may not contain NUL: {value!r}")
    raw = value.encode()
    return raw + (b"\0\0" if len(raw) == 15 else b"\0")


def id_text(stored: bytes | memoryview) -> str:
    """The id `compact_id` stored."""
    stored = bytes(stored)
    if len(stored) == 16:
        return str(uuid.UUID(bytes=stored))
    return stored.rstrip(b"\0").decode()


class CompactIdField(models.Field):
    """A text id (str in Python) stored as `compact_id` bytes: a binary
    column, but not a BinaryField, which holds content (ciphertext)."""

    description = "An id stored as compact bytes"

    def get_internal_type(self) -> str:
        return "BinaryField"

    def get_prep_value(self, value):
        value = super().get_prep_value(value)
        if isinstance(value, str):
            return compact_id(value)
        return value

    def get_db_prep_value(self, value, connection, prepared=False):
        value = super().get_db_prep_value(value, connection, prepared)
        return None if value is None else connection.Database.Binary(value)

    def from_db_value(self, value, expression, connection):
        return None if value is None else id_text(value)

    def to_python(self, value):
        if isinstance(value, (bytes, memoryview)):
            return id_text(value)
        return value


class Checkpoint(models.Model):
    """One super-step of a thread: the state's versions and its metadata.

    `checkpoint` holds the encrypted checkpoint without its large channel
    values (those are `ChannelBlob` rows); `metadata` the encrypted metadata.
    `step`, `source` and `run_id` are copies of metadata fields, kept to
    narrow `list(filter=...)` and for `delete_for_runs`; `blob_versions`
    names the blobs the checkpoint uses. All are structure, never content.
    """

    # Its identity is the primary key: no surrogate id (a column and an index
    # per row).
    pk = models.CompositePrimaryKey("thread", "checkpoint_ns", "checkpoint_id")
    thread = models.ForeignKey(
        Thread, on_delete=models.CASCADE, related_name="checkpoints", db_index=False
    )
    checkpoint_ns = models.TextField(blank=True, default="")
    checkpoint_id = CompactIdField()
    parent_checkpoint_id = CompactIdField(blank=True, default="")
    step = models.IntegerField(null=True, blank=True)
    source = models.CharField(max_length=16, blank=True)
    run_id = CompactIdField(blank=True, default="")
    # Channel -> version of the values kept as ChannelBlob rows, so one query
    # finds them. The encrypted checkpoint holds the same, and reads trust
    # only that: an altered map finds no blob, which is an error.
    blob_versions = models.JSONField(default=dict)
    checkpoint = models.BinaryField()
    metadata = models.BinaryField()
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        # The primary key is also the access path of get_tuple (latest first)
        # and list.
        indexes = [
            models.Index(
                fields=["run_id"],
                condition=~Q(run_id=""),
                name="checkpoint_run_id",
            )
        ]

    def __str__(self) -> str:
        return f"{self.thread_id}:{self.checkpoint_ns}:{self.checkpoint_id}"


class ChannelBlob(models.Model):
    """A channel's value at one version, written only when the version is new."""

    # Its identity is the primary key: no surrogate id (a column and an index
    # per row).
    pk = models.CompositePrimaryKey("thread", "checkpoint_ns", "channel", "version")
    thread = models.ForeignKey(
        Thread, on_delete=models.CASCADE, related_name="+", db_index=False
    )
    checkpoint_ns = models.TextField(blank=True, default="")
    channel = models.CharField(max_length=255)
    version = models.CharField(max_length=64)
    value = models.BinaryField()

    def __str__(self) -> str:
        return f"{self.thread_id}:{self.checkpoint_ns}:{self.channel}@{self.version}"


class PendingWrite(models.Model):
    """A task's write against a checkpoint, not yet folded into the next one.

    `idx` is the write's position in its task's writes, or a negative number
    for the special channels (`__error__`, `__interrupt__`, ...), which a task
    overwrites; regular writes are never overwritten.
    """

    # Its identity is the primary key: no surrogate id (a column and an index
    # per row).
    pk = models.CompositePrimaryKey(
        "thread", "checkpoint_ns", "checkpoint_id", "task_id", "idx"
    )
    thread = models.ForeignKey(
        Thread, on_delete=models.CASCADE, related_name="+", db_index=False
    )
    checkpoint_ns = models.TextField(blank=True, default="")
    checkpoint_id = CompactIdField()
    task_id = CompactIdField()
    idx = models.IntegerField()
    channel = models.CharField(max_length=255)
    task_path = models.TextField(blank=True, default="")
    value = models.BinaryField()

    def __str__(self) -> str:
        return (
            f"{self.thread_id}:{self.checkpoint_ns}:{self.checkpoint_id}"
            f" {self.task_id}[{self.idx}] {self.channel}"
        )
