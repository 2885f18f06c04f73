"""LangGraph's checkpoints, as `runs.checkpointer.DjangoSaver` stores them.

Plaintext columns hold structure only (ids, namespaces, channel names,
versions, steps); every value is ciphertext from `runs.crypto.ThreadCipher`,
bound to its row. The thread foreign keys carry no index of their own: each
table's unique index starts with the thread.
"""

from django.db import models
from django.db.models import Q
from django.utils import timezone

from runs.models.threads import Thread


class Checkpoint(models.Model):
    """One super-step of a thread: the state's versions and its metadata.

    `checkpoint` holds the encrypted checkpoint without its large channel
    values (those are `ChannelBlob` rows); `metadata` the encrypted metadata.
    `step`, `source` and `run_id` are copies of metadata fields, kept to
    narrow `list(filter=...)` and for `delete_for_runs`; `blob_versions`
    names the blobs the checkpoint uses. All are structure, never content.
    """

    thread = models.ForeignKey(
        Thread, on_delete=models.CASCADE, related_name="checkpoints", db_index=False
    )
    checkpoint_ns = models.TextField(blank=True, default="")
    checkpoint_id = models.CharField(max_length=64)
    parent_checkpoint_id = models.CharField(max_length=64, blank=True, default="")
    step = models.IntegerField(null=True, blank=True)
    source = models.CharField(max_length=16, blank=True)
    run_id = models.CharField(max_length=64, blank=True)
    # Channel -> version of the values kept as ChannelBlob rows, so one query
    # finds them. The encrypted checkpoint holds the same, and reads trust
    # only that: an altered map finds no blob, which is an error.
    blob_versions = models.JSONField(default=dict)
    checkpoint = models.BinaryField()
    metadata = models.BinaryField()
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            # Also the access path of get_tuple (latest first) and list.
            models.UniqueConstraint(
                fields=["thread", "checkpoint_ns", "checkpoint_id"],
                name="checkpoint_identity",
            )
        ]
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

    thread = models.ForeignKey(
        Thread, on_delete=models.CASCADE, related_name="+", db_index=False
    )
    checkpoint_ns = models.TextField(blank=True, default="")
    channel = models.CharField(max_length=255)
    version = models.CharField(max_length=64)
    value = models.BinaryField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["thread", "checkpoint_ns", "channel", "version"],
                name="channel_blob_identity",
            )
        ]

    def __str__(self) -> str:
        return f"{self.thread_id}:{self.checkpoint_ns}:{self.channel}@{self.version}"


class PendingWrite(models.Model):
    """A task's write against a checkpoint, not yet folded into the next one.

    `idx` is the write's position in its task's writes, or a negative number
    for the special channels (`__error__`, `__interrupt__`, ...), which a task
    overwrites; regular writes are never overwritten.
    """

    thread = models.ForeignKey(
        Thread, on_delete=models.CASCADE, related_name="+", db_index=False
    )
    checkpoint_ns = models.TextField(blank=True, default="")
    checkpoint_id = models.CharField(max_length=64)
    task_id = models.CharField(max_length=255)
    idx = models.IntegerField()
    channel = models.CharField(max_length=255)
    task_path = models.TextField(blank=True, default="")
    value = models.BinaryField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["thread", "checkpoint_ns", "checkpoint_id", "task_id", "idx"],
                name="pending_write_identity",
            )
        ]

    def __str__(self) -> str:
        return (
            f"{self.thread_id}:{self.checkpoint_ns}:{self.checkpoint_id}"
            f" {self.task_id}[{self.idx}] {self.channel}"
        )
