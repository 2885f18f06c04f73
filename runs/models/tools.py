"""The side-effect ledger."""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from runs.models.content import ThreadContent
from runs.models.tenancy import Tenant, TenantOwnedQuerySet
from runs.models.threads import Thread


class ToolCall(models.Model):
    """One side effect, recorded before it is attempted and after it succeeded.

    A row left `started` is the crash window made visible: the call may or may
    not have reached the downstream system, which is why the call carries an
    idempotency key that the downstream system deduplicates on.
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
    result = models.BinaryField(null=True, editable=False)
    error_type = models.CharField(max_length=200, blank=True)
    started_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = TenantOwnedQuerySet.as_manager()

    # Cleared when the thread is removed (runs.storage.content_clear).
    thread_content = (ThreadContent("tool_results", fields=("result",)),)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["thread", "idempotency_key"], name="toolcall_thread_key"
            )
        ]

    def __str__(self) -> str:
        return f"{self.tool} [{self.idempotency_key[:12]}] {self.status}"
