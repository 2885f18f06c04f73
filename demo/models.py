"""The demo agent's downstream systems: a payments provider and an outbox.

Stand-ins, kept apart from the platform: the platform apps never import the
demo app.
"""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from runs.models import Tenant, TenantOwnedQuerySet, Thread, ThreadContent


class DemoPayment(models.Model):
    """The demo payments provider's ledger: one payment per idempotency key,
    as a real payment API deduplicates on its Idempotency-Key header."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    idempotency_key = models.CharField(max_length=64, unique=True)
    order_id = models.CharField(max_length=100)
    amount = models.DecimalField(max_digits=12, decimal_places=2)
    currency = models.CharField(max_length=3, default="EUR")
    created_at = models.DateTimeField(default=timezone.now)

    objects = TenantOwnedQuerySet.as_manager()

    def __str__(self) -> str:
        return f"refund {self.amount} {self.currency} on {self.order_id}"


class DemoOutboxMessage(models.Model):
    """The demo customer-notification outbox; the body is thread ciphertext."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    thread = models.ForeignKey(Thread, on_delete=models.CASCADE, related_name="+")
    idempotency_key = models.CharField(max_length=64, unique=True)
    kind = models.CharField(max_length=32)
    body = models.BinaryField()
    created_at = models.DateTimeField(default=timezone.now)

    objects = TenantOwnedQuerySet.as_manager()

    # The rows are the thread's content: deleted when the thread is removed
    # (runs.storage.content_clear).
    thread_content = (ThreadContent("outbox_messages"),)

    def __str__(self) -> str:
        return f"{self.kind} message [{self.idempotency_key[:12]}]"
