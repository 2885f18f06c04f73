"""The demo agents' downstream systems: a payments provider, an outbox, a
warehouse, a card processor and a courier.

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


class DemoStockReservation(models.Model):
    """The demo warehouse: stock held for an order until it is released."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    idempotency_key = models.CharField(max_length=64, unique=True)
    order_id = models.CharField(max_length=100)
    # [{"sku", "qty"}]: catalogue data, not personal.
    lines = models.JSONField(default=list)
    created_at = models.DateTimeField(default=timezone.now)
    released_at = models.DateTimeField(null=True, blank=True)

    objects = TenantOwnedQuerySet.as_manager()

    def __str__(self) -> str:
        return f"stock for {self.order_id}" + (
            " (released)" if self.released_at else ""
        )


class DemoCharge(models.Model):
    """The demo card processor: one charge per idempotency key, refundable."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    idempotency_key = models.CharField(max_length=64, unique=True)
    order_id = models.CharField(max_length=100)
    amount = models.DecimalField(max_digits=12, decimal_places=2)
    currency = models.CharField(max_length=3, default="EUR")
    created_at = models.DateTimeField(default=timezone.now)
    refunded_at = models.DateTimeField(null=True, blank=True)

    objects = TenantOwnedQuerySet.as_manager()

    def __str__(self) -> str:
        return f"charge {self.amount} {self.currency} on {self.order_id}"


class DemoCourierBooking(models.Model):
    """The demo courier's bookings: one per idempotency key, cancellable."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    idempotency_key = models.CharField(max_length=64, unique=True)
    order_id = models.CharField(max_length=100)
    parcels = models.PositiveIntegerField(default=1)
    created_at = models.DateTimeField(default=timezone.now)
    cancelled_at = models.DateTimeField(null=True, blank=True)

    objects = TenantOwnedQuerySet.as_manager()

    def __str__(self) -> str:
        return f"courier for {self.order_id}"


class DemoCourierCall(models.Model):
    """Every request the demo courier received, answered or not (its access
    log): how the stand-in counts the outages an order asks for."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    idempotency_key = models.CharField(max_length=64, db_index=True)
    outcome = models.CharField(max_length=32)
    created_at = models.DateTimeField(default=timezone.now)

    objects = TenantOwnedQuerySet.as_manager()

    def __str__(self) -> str:
        return f"courier call [{self.idempotency_key[:12]}] {self.outcome}"
