"""The side-effect ledger."""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from runs.models.content import ThreadContent
from runs.models.tenancy import Tenant, TenantOwnedQuerySet
from runs.models.threads import Thread


class ToolCall(models.Model):
    """One side effect, recorded before each attempt and after it.

    A row left `started` is the crash window made visible: the call may or may
    not have reached the downstream system, which is why the call carries an
    idempotency key that the downstream system deduplicates on. Every attempt
    under that one key is in `attempt_log`, with its outcome.

    A row with a `compensation` can be undone (runs.compensation): the undoing
    is a row of its own, whose `compensates` is this one.
    """

    class Status(models.TextChoices):
        STARTED = "started", "Started"
        SUCCEEDED = "succeeded", "Succeeded"
        FAILED = "failed", "Failed"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    thread = models.ForeignKey(
        Thread, on_delete=models.CASCADE, related_name="tool_calls"
    )
    idempotency_key = models.CharField(max_length=64)
    tool = models.CharField(max_length=100)
    args_digest = models.CharField(max_length=64)
    status = models.CharField(max_length=16, choices=Status.choices)
    attempts = models.PositiveIntegerField(default=1)
    # [{"attempt", "outcome", "started", "ended"?, "error_type"?}], oldest
    # first; outcome: started, succeeded, failed, timed_out, or lost (the
    # worker died during the attempt). Exception types only, never messages.
    attempt_log = models.JSONField(default=list, blank=True)
    result = models.BinaryField(null=True, editable=False)
    error_type = models.CharField(max_length=200, blank=True)
    # The run that first made the call (a saga spans the runs of a thread
    # since its last successful one: runs.compensation).
    run_id = models.CharField(max_length=64, blank=True)
    # `module:function` that undoes the call, and the arguments it needs
    # (thread ciphertext); empty for calls that cannot be undone.
    compensation = models.CharField(max_length=200, blank=True)
    args = models.BinaryField(null=True, editable=False)
    compensates = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="compensations",
    )
    # When a person closed the thread with this call's undoing still
    # outstanding (runs.services.thread_close): the call stands as done, and
    # no later run's compensation undoes it.
    settled_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = TenantOwnedQuerySet.as_manager()

    # Cleared when the thread is removed (runs.storage.content_clear).
    thread_content = (ThreadContent("tool_results", fields=("result", "args")),)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["thread", "idempotency_key"], name="toolcall_thread_key"
            )
        ]

    def __str__(self) -> str:
        return f"{self.tool} [{self.idempotency_key[:12]}] {self.status}"
