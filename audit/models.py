"""The audit trail: events that outlive the data they describe, sealed into
hash-chained blocks per tenant."""

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
    chain every committed prefix. The sealer only reads this row (a plain read
    never waits for the lock), so sealing does not hold up writers.
    """

    tenant = models.OneToOneField(Tenant, on_delete=models.PROTECT, primary_key=True)
    last_seq = models.BigIntegerField(default=0)
    # The time of the last event: the next one is never stamped earlier, so
    # within a tenant, time order and sequence order are the same order.
    last_at = models.DateTimeField(null=True, blank=True)

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
    # The person an API key acted for (a reviewer deciding through a chat bot).
    actor_on_behalf_of = models.CharField(max_length=200, blank=True, default="")
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
            # Serves time ranges in the API's order with no sort: a day's
            # first page reads 51 index entries, however big the tenant.
            models.Index(
                fields=["tenant", "occurred_at", "seq"], name="audit_tenant_time_seq"
            ),
            models.Index(
                fields=["tenant", "thread_id", "seq"], name="audit_tenant_thread"
            ),
            # Verification starts from the latest purge; without this, finding
            # it scans every event of a tenant that was never purged.
            models.Index(
                fields=["tenant", "seq"],
                condition=models.Q(kind="audit.purged"),
                name="audit_tenant_purges",
            ),
        ]
        ordering = ["tenant", "seq"]

    def __str__(self) -> str:
        return f"{self.tenant} #{self.seq} {self.kind}"


class AuditBlock(models.Model):
    """A sealed, contiguous range of one tenant's events, chained to the last.

    Blocks name a range of sequence numbers rather than being pointed at by
    the events, so sealing never updates an event row (the events table
    refuses updates). `leaves` holds the first 8 bytes of each event's digest,
    in order: verification uses them to name the first event that no longer
    matches, while `events_hash` covers the full digests. `block_hash` is an
    HMAC under the audit key `key_id`, which is not in the database.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    first_seq = models.BigIntegerField()
    last_seq = models.BigIntegerField()
    events_hash = models.CharField(max_length=64)
    leaves = models.BinaryField()
    prev_hash = models.CharField(max_length=64)
    block_hash = models.CharField(max_length=64)
    # The audit key that sealed the block (GATEHOUSE_AUDIT_KEYS); empty for a
    # block sealed before seals were keyed (see audit_reseal_legacy).
    key_id = models.CharField(max_length=64, blank=True, default="")
    sealed_at = models.DateTimeField()

    objects = TenantOwnedQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "first_seq"], name="audit_block_tenant_first"
            ),
            models.UniqueConstraint(
                fields=["tenant", "last_seq"], name="audit_block_tenant_last"
            ),
            models.CheckConstraint(
                condition=models.Q(last_seq__gte=models.F("first_seq")),
                name="audit_block_range",
            ),
        ]
        ordering = ["tenant", "first_seq"]

    def __str__(self) -> str:
        return f"{self.tenant} #{self.first_seq}-{self.last_seq}"

    @property
    def event_count(self) -> int:
        return self.last_seq - self.first_seq + 1


class AuditChainHead(models.Model):
    """Where a tenant's chain ends: the sealers' cursor and their lock.

    A sealer locks this row (SKIP LOCKED) for the tenant it seals, so two
    sealers never build overlapping blocks and never wait for each other. It
    is a cache of the last block; verification recomputes from the blocks.
    """

    tenant = models.OneToOneField(Tenant, on_delete=models.PROTECT, primary_key=True)
    last_seq = models.BigIntegerField(default=0)
    block_hash = models.CharField(max_length=64, blank=True)
    updated_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.tenant}: sealed to #{self.last_seq}"


class AuditVerification(models.Model):
    """The outcome of one recomputation of a tenant's chain, signed.

    Rows are append-only (a trigger on Postgres) and signed with the audit key,
    so a row written behind the application's back (a forged "ok") shows as
    such in the admin.
    """

    tenant = models.ForeignKey(
        Tenant, on_delete=models.PROTECT, related_name="audit_verifications"
    )
    checked_at = models.DateTimeField(default=timezone.now, db_index=True)
    ok = models.BooleanField()
    blocks = models.BigIntegerField(default=0)
    events = models.BigIntegerField(default=0)
    unsealed = models.BigIntegerField(default=0)
    first_bad_seq = models.BigIntegerField(null=True, blank=True)
    problem = models.CharField(max_length=500, blank=True)
    head_seq = models.BigIntegerField(default=0)
    head_hash = models.CharField(max_length=64, blank=True)
    checked_by = models.CharField(max_length=200, blank=True)
    # The head saved earlier that the chain was checked against, if any.
    against_seq = models.BigIntegerField(null=True, blank=True)
    against_hash = models.CharField(max_length=64, blank=True)
    key_id = models.CharField(max_length=64, blank=True)
    signature = models.CharField(max_length=64, blank=True)

    objects = TenantOwnedQuerySet.as_manager()

    class Meta:
        ordering = ["-checked_at"]
        indexes = [
            models.Index(fields=["tenant", "-checked_at"], name="audit_verif_latest")
        ]

    def __str__(self) -> str:
        verdict = "ok" if self.ok else f"broken at #{self.first_bad_seq}"
        return f"{self.tenant} {self.checked_at:%Y-%m-%d %H:%M}: {verdict}"
