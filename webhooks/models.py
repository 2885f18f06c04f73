"""A tenant's webhook subscriptions, and the log of every delivery."""

from __future__ import annotations

import uuid
from urllib.parse import urlsplit

from django.db import models
from django.db.models import Q
from django.utils import timezone

from runs.models import (
    Run,
    Tenant,
    TenantOwnedQuerySet,
    Thread,
    ThreadContent,
    WrappedKey,
)

# The events a subscription may ask for (api.md).
EVENTS = (
    "approval.requested",
    "approval.escalated",
    "approval.decided",
    "run.interrupted",
    "run.succeeded",
    "run.failed",
    "thread.deleted",
)


# The kind of row a subscription's wrapped secret names (runs.crypto.KeyOwner).
SECRET_KEY_OWNER = "webhook-subscription"


def origin(url: str) -> str:
    """scheme://host[:port] of a URL: what the delivery log shows of a target
    (a path or a query may carry a token)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


class WebhookSubscription(models.Model):
    """An endpoint of the tenant's that Gatehouse may post to, and the events
    it wants. Its signing secret is a random key wrapped by the master key
    ring (as a thread's data key is), shown once when created.

    A subscription is also what lets a run's own `webhook=` post to its
    origin: Gatehouse posts run results only to receivers a tenant registered.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(
        Tenant, on_delete=models.CASCADE, related_name="webhook_subscriptions"
    )
    url = models.URLField(max_length=2000)
    events = models.JSONField(default=list, blank=True)
    # Add the thread's values to run events: content the audit trail never holds.
    include_content = models.BooleanField(default=False)
    wrapped_secret = models.BinaryField(editable=False)
    secret_key_id = models.CharField(max_length=64, editable=False)
    created_by = models.CharField(max_length=200, blank=True, editable=False)
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    objects = TenantOwnedQuerySet.as_manager()

    # Rewrapped by `manage.py rotate_master_key` with the threads' keys.
    wrapped_keys = (
        WrappedKey("wrapped_secret", "secret_key_id", owner=SECRET_KEY_OWNER),
    )

    class Meta:
        ordering = ["tenant", "created_at"]

    def __str__(self) -> str:
        return f"{self.tenant} → {self.origin}"

    @property
    def origin(self) -> str:
        return origin(self.url)

    @property
    def secret_key_owner(self) -> tuple[str, str]:
        """What the wrapped secret is bound to (runs.crypto.KeyOwner)."""
        return self.wrapped_keys[0].owner_of(self)


class WebhookDelivery(models.Model):
    """One message to one endpoint, and how sending it went.

    The log shows the event, the target's origin, the status, the attempts
    and the last answer, never the body. A body that carries thread content
    (a run's own webhook, or a subscription with `include_content`) is stored
    encrypted with the thread's key (`sealed_body`), so deleting the thread
    makes it unsendable; any other body holds only what the audit trail holds
    (`body`).
    """

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        DELIVERED = "delivered", "Delivered"
        FAILED = "failed", "Failed (gave up)"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    subscription = models.ForeignKey(
        WebhookSubscription,
        on_delete=models.SET_NULL,
        null=True,
        related_name="deliveries",
    )
    # A run's own webhook (the SDK's `webhook=`): its URL is read from there.
    run = models.ForeignKey(Run, on_delete=models.SET_NULL, null=True, related_name="+")
    thread = models.ForeignKey(
        Thread, on_delete=models.SET_NULL, null=True, related_name="+"
    )
    event_type = models.CharField(max_length=64)
    target = models.CharField(max_length=300, help_text="The target's origin.")
    body = models.JSONField(null=True, editable=False)
    sealed_body = models.BinaryField(null=True, editable=False)
    status = models.CharField(
        max_length=16, choices=Status.choices, default=Status.PENDING
    )
    attempts = models.PositiveSmallIntegerField(default=0)
    last_status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=300, blank=True)
    next_attempt_at = models.DateTimeField(default=timezone.now)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    delivered_at = models.DateTimeField(null=True, blank=True)

    objects = TenantOwnedQuerySet.as_manager()

    # Cleared when the thread is removed (runs.storage.content_clear): a
    # message that carried its content can no longer be sent.
    thread_content = (ThreadContent("webhook_bodies", fields=("sealed_body",)),)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(
                fields=["next_attempt_at"],
                condition=Q(status="pending"),
                name="webhook_delivery_due",
            ),
            models.Index(
                fields=["tenant", "created_at"], name="webhook_delivery_tenant"
            ),
        ]
        verbose_name_plural = "webhook deliveries"

    def __str__(self) -> str:
        return f"{self.event_type} → {self.target} ({self.status})"

    @property
    def message_id(self) -> str:
        """Standard Webhooks' `webhook-id`: the same on every attempt."""
        return f"msg_{self.id.hex}"
