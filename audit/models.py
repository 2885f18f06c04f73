"""The audit trail: events that outlive the data they describe."""

from django.db import models
from django.utils import timezone

from runs.models import Tenant, TenantOwnedQuerySet


class ActorType(models.TextChoices):
    USER = "user", "User"
    API_KEY = "api_key", "API key"
    AGENT = "agent", "Agent"
    SYSTEM = "system", "System"


class AuditSequence(models.Model):
    """The last sequence number handed out per tenant.

    The row is locked from an event's insertion to its transaction's commit, so
    a tenant's sequence numbers commit in order and without gaps: a sealer can
    chain every committed prefix.
    """

    tenant = models.OneToOneField(Tenant, on_delete=models.PROTECT, primary_key=True)
    last_seq = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.tenant}: {self.last_seq}"


class AuditEvent(models.Model):
    # PROTECT: the trail must outlive everything it describes; a tenant with
    # events cannot be deleted by accident.
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    seq = models.BigIntegerField()
    occurred_at = models.DateTimeField(default=timezone.now)
    actor_type = models.CharField(max_length=16, choices=ActorType.choices)
    actor_id = models.CharField(max_length=64, blank=True)
    actor_label = models.CharField(max_length=200, blank=True)
    kind = models.CharField(max_length=64)
    # References by value, not foreign keys: the thread and run go away, the
    # event stays.
    thread_id = models.CharField(max_length=255, blank=True, db_index=False)
    run_id = models.CharField(max_length=64, blank=True)
    action = models.CharField(max_length=100, blank=True)
    summary = models.CharField(max_length=500)
    data = models.JSONField(default=dict)

    objects = TenantOwnedQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "seq"], name="audit_event_tenant_seq"
            )
        ]
        indexes = [
            models.Index(fields=["tenant", "occurred_at"], name="audit_tenant_time"),
            models.Index(
                fields=["tenant", "thread_id", "seq"], name="audit_tenant_thread"
            ),
        ]
        ordering = ["tenant", "seq"]

    def __str__(self) -> str:
        return f"{self.tenant} #{self.seq} {self.kind}"
