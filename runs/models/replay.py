"""Values a run drew from the world (the clock, randomness), recorded per thread."""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from runs.models.content import ThreadContent
from runs.models.tenancy import Tenant, TenantOwnedQuerySet
from runs.models.threads import Thread


class RecordedValue(models.Model):
    """One `now()`, `random()`, `uuid4()` or `Random` seed of an agent's step.

    `key` is a digest of the step (checkpoint namespace and task id) and the
    call's position in it, so a step that runs again after a crash or a
    resume finds the values of its first execution in the same order. `kind`
    (structure) lets a step that asks for another kind at the same position
    fail as non-deterministic; `value` is thread ciphertext.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    thread = models.ForeignKey(
        Thread, on_delete=models.CASCADE, related_name="+", db_index=False
    )
    key = models.CharField(max_length=64)
    kind = models.CharField(max_length=16)
    value = models.BinaryField()
    created_at = models.DateTimeField(default=timezone.now)

    objects = TenantOwnedQuerySet.as_manager()

    # The rows are the thread's content: deleted when the thread is removed
    # (runs.storage.content_clear).
    thread_content = (ThreadContent("recorded_values"),)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["thread", "key"], name="recorded_value_thread_key"
            )
        ]

    def __str__(self) -> str:
        return f"{self.kind} [{self.key[:12]}]"
