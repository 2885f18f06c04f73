"""Retention policies, legal holds and deletion requests."""

from __future__ import annotations

import uuid
from datetime import timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

from approvals import policy as approvals_policy
from runs.fixed_queries import FixedQuery
from runs.models import Role, Tenant, TenantOwnedQuerySet, Thread

# Bounds that catch typos (a TTL of 36,500 days, an approval due in a year)
# without getting in the way of any real policy.
MAX_TTL_DAYS = 3650
MAX_AUDIT_RETENTION_DAYS = 36500
MAX_KEEP_LATEST = 10_000
MAX_APPROVAL_HOURS = 30 * 24
MAX_CHAIN_STEPS = 5
CHAIN_STEP_KEYS = {"name", "after_hours", "notify"}


def default_checkpoint_ttl_days() -> int:
    return settings.GATEHOUSE_CHECKPOINT_TTL_DAYS


def default_keep_latest() -> int:
    return settings.GATEHOUSE_KEEP_LATEST_CHECKPOINTS


def default_audit_retention_days() -> int:
    return settings.GATEHOUSE_AUDIT_RETENTION_DAYS


def default_due_hours_low() -> int:
    return approvals_policy.default_due_hours("low")


def default_due_hours_medium() -> int:
    return approvals_policy.default_due_hours("medium")


def default_due_hours_high() -> int:
    return approvals_policy.default_due_hours("high")


def default_escalation_chain() -> list[dict]:
    return approvals_policy.default_chain()


def default_expire_after_hours() -> int:
    return approvals_policy.default_expire_after_hours()


def _bounded(low: int, high: int) -> list:
    return [MinValueValidator(low), MaxValueValidator(high)]


def validate_escalation_chain(chain) -> None:
    """Raise ValidationError unless `chain` is a list of sane steps."""
    if not isinstance(chain, list):
        raise ValidationError("the escalation chain must be a list of steps")
    if len(chain) > MAX_CHAIN_STEPS:
        raise ValidationError(
            f"the escalation chain has at most {MAX_CHAIN_STEPS} steps"
        )
    names = set()
    for number, step in enumerate(chain, start=1):
        where = f"step {number}"
        if not isinstance(step, dict) or set(step) != CHAIN_STEP_KEYS:
            raise ValidationError(
                f"{where} must be an object with exactly the keys name, "
                "after_hours and notify"
            )
        name, hours, notify = step["name"], step["after_hours"], step["notify"]
        if not isinstance(name, str) or not name.strip() or len(name) > 32:
            raise ValidationError(f"{where}: name must be 1 to 32 characters")
        if name in names:
            raise ValidationError(f"{where}: the name {name!r} is used twice")
        names.add(name)
        if isinstance(hours, bool) or not isinstance(hours, int | float):
            raise ValidationError(f"{where}: after_hours must be a number")
        low = 0 if number == 1 else 1
        if not low <= hours <= MAX_APPROVAL_HOURS:
            raise ValidationError(
                f"{where}: after_hours must be between {low} and {MAX_APPROVAL_HOURS}"
            )
        if (
            not isinstance(notify, list)
            or not notify
            or any(role not in Role.values for role in notify)
        ):
            raise ValidationError(
                f"{where}: notify must list one or more of {', '.join(Role.values)}"
            )


class RetentionPolicy(models.Model):
    """How long a tenant's data lives, and how its approvals escalate.

    A tenant without a row gets the defaults from settings
    (`RetentionPolicy.for_tenant` returns them as an unsaved policy).
    """

    class FinalAction(models.TextChoices):
        DENY = "deny", "Deny with a system note and resume the run"

    tenant = models.OneToOneField(
        Tenant, on_delete=models.CASCADE, related_name="retention_policy"
    )
    checkpoint_ttl_days = models.PositiveIntegerField(
        default=default_checkpoint_ttl_days,
        validators=_bounded(1, MAX_TTL_DAYS),
        help_text="A thread with no activity for this many days is deleted "
        "(key destroyed, rows removed; the audit trail stays).",
    )
    keep_latest_checkpoints = models.PositiveIntegerField(
        default=default_keep_latest,
        validators=_bounded(1, MAX_KEEP_LATEST),
        help_text="Checkpoints kept per thread; older ones are pruned.",
    )
    audit_retention_days = models.PositiveIntegerField(
        default=default_audit_retention_days,
        validators=_bounded(1, MAX_AUDIT_RETENTION_DAYS),
        help_text="Audit events older than this are purged. Never shorter than "
        "the checkpoint TTL.",
    )
    approval_due_hours_low = models.PositiveIntegerField(
        default=default_due_hours_low, validators=_bounded(1, MAX_APPROVAL_HOURS)
    )
    approval_due_hours_medium = models.PositiveIntegerField(
        default=default_due_hours_medium, validators=_bounded(1, MAX_APPROVAL_HOURS)
    )
    approval_due_hours_high = models.PositiveIntegerField(
        default=default_due_hours_high, validators=_bounded(1, MAX_APPROVAL_HOURS)
    )
    escalation_chain = models.JSONField(
        default=default_escalation_chain,
        validators=[validate_escalation_chain],
        help_text='Hops after the due time, each {"name", "after_hours" (after the '
        'previous hop), "notify": [roles]}. Example: remind reviewers at the due '
        "time, escalate to compliance officers 4 hours later.",
    )
    expire_after_hours = models.PositiveIntegerField(
        default=default_expire_after_hours,
        validators=_bounded(1, MAX_APPROVAL_HOURS),
        help_text="Hours after the last hop before the final action.",
    )
    final_action = models.CharField(
        max_length=16, choices=FinalAction.choices, default=FinalAction.DENY
    )
    updated_at = models.DateTimeField(auto_now=True)
    updated_by = models.CharField(max_length=200, blank=True, editable=False)

    objects = TenantOwnedQuerySet.as_manager()

    class Meta:
        verbose_name_plural = "retention policies"

    def __str__(self) -> str:
        return f"retention policy of {self.tenant}"

    def clean(self) -> None:
        super().clean()
        ttl, audit = self.checkpoint_ttl_days, self.audit_retention_days
        floor = settings.GATEHOUSE_AUDIT_RETENTION_MIN_DAYS
        if audit is not None and audit < floor:
            raise ValidationError(
                {
                    "audit_retention_days": (
                        f"audit retention ({audit} days) cannot be shorter than "
                        f"{floor} days, the operator's minimum "
                        "(GATEHOUSE_AUDIT_RETENTION_MIN_DAYS)"
                    )
                }
            )
        if ttl is not None and audit is not None and audit < ttl:
            raise ValidationError(
                {
                    "audit_retention_days": (
                        f"audit retention ({audit} days) cannot be shorter than the "
                        f"checkpoint TTL ({ttl} days): the trail must outlive the "
                        "data it describes"
                    )
                }
            )

    @classmethod
    def for_tenant(cls, tenant: Tenant) -> RetentionPolicy:
        """The tenant's policy, or the defaults (unsaved) when it has none."""
        rows = _POLICY_OF_TENANT(tenant.pk)
        return rows[0] if rows else cls(tenant=tenant)

    @property
    def checkpoint_ttl(self) -> timedelta:
        return timedelta(days=self.checkpoint_ttl_days)

    @property
    def audit_retention(self) -> timedelta:
        return timedelta(days=self.audit_retention_days)

    def approval_policy(self) -> approvals_policy.ApprovalPolicy:
        """This tenant's approval policy, as approvals reads it
        (approvals.policy; registered by RetentionConfig.ready)."""
        return approvals_policy.ApprovalPolicy.from_stored(
            due_hours={
                "low": self.approval_due_hours_low,
                "medium": self.approval_due_hours_medium,
                "high": self.approval_due_hours_high,
            },
            chain=self.escalation_chain,
            expire_after_hours=self.expire_after_hours,
        )


# Read at every approval request a run opens (approvals.policy, registered by
# RetentionConfig.ready), so compiled once per process (runs.fixed_queries).
# At most one row: the tenant is the policy's one-to-one key.
_POLICY_OF_TENANT = FixedQuery(
    lambda tenant_pk: RetentionPolicy.objects.filter(tenant_id=tenant_pk).order_by(),
    -1,
)


class LegalHoldQuerySet(TenantOwnedQuerySet):
    def active(self) -> LegalHoldQuerySet:
        return self.filter(lifted_at__isnull=True)

    def on_tenant(self) -> LegalHoldQuerySet:
        return self.filter(thread__isnull=True)


class LegalHold(models.Model):
    """A compliance officer's hold on a thread, or on a whole tenant (no thread).

    While a hold is active, the data it covers is never expired, pruned or
    deleted; deletion requests for it wait (`on_hold`). `Thread.legal_hold`
    mirrors "this thread has an active hold of its own", for the checkpoint
    store's own check; a tenant-wide hold is looked up here.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    # PROTECT: a hold must never silently become a tenant-wide one.
    thread = models.ForeignKey(
        Thread,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="legal_holds",
        help_text="Leave empty to hold every thread of the tenant.",
    )
    reason = models.TextField(help_text="Why the data must be kept (matter, ticket).")
    placed_by_type = models.CharField(max_length=16, editable=False)
    placed_by_id = models.CharField(max_length=64, blank=True, editable=False)
    placed_by = models.CharField(max_length=200, editable=False)
    placed_at = models.DateTimeField(default=timezone.now, editable=False)
    lifted_at = models.DateTimeField(null=True, blank=True, editable=False)
    lifted_by = models.CharField(max_length=200, blank=True, editable=False)
    lift_reason = models.TextField(blank=True, editable=False)

    objects = LegalHoldQuerySet.as_manager()

    class Meta:
        indexes = [
            models.Index(
                fields=["tenant", "thread"],
                condition=Q(lifted_at__isnull=True),
                name="legal_hold_active",
            )
        ]
        ordering = ["-placed_at"]

    def __str__(self) -> str:
        state = "lifted" if self.lifted_at else "active"
        return f"hold #{self.pk} on {self.covers} ({state})"

    @property
    def covers(self) -> str:
        """What the hold keeps, in words: one thread, or all of a tenant's."""
        if self.thread_id:
            return f"thread {self.thread.thread_id} only"
        return f"every thread of {self.tenant.slug}"

    @property
    def is_active(self) -> bool:
        return self.lifted_at is None


class DeletionRequest(models.Model):
    """A request to delete a thread or a data subject's threads, and its record.

    The threads' data keys are destroyed when the request is accepted, so
    their content is unreadable at once; the rows are then removed by the
    `carry_out_deletions` job, and `record` says what was removed (counts and
    thread ids, never content). Threads under legal hold wait: the request is
    `on_hold` until the hold is lifted.
    """

    class Kind(models.TextChoices):
        THREAD = "thread", "Thread"
        SUBJECT = "subject", "Data subject"

    class Status(models.TextChoices):
        ON_HOLD = "on_hold", "Waiting: legal hold"
        SHREDDED = "shredded", "Keys destroyed; removing rows"
        COMPLETED = "completed", "Completed"

    OPEN = (Status.ON_HOLD, Status.SHREDDED)

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.THREAD)
    # The thread (its tombstone once deleted) and, by value, its client id.
    thread = models.ForeignKey(
        Thread, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    thread_ref = models.CharField(max_length=255, blank=True)
    # A subject request: the subject's blind index, never the subject itself.
    subject_hash = models.CharField(max_length=64, blank=True)
    # Who asked: an audit actor's type, id and label snapshot.
    requested_by_type = models.CharField(max_length=16)
    requested_by_id = models.CharField(max_length=64, blank=True)
    requested_by = models.CharField(max_length=200)
    status = models.CharField(max_length=16, choices=Status.choices)
    record = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)
    completed_at = models.DateTimeField(null=True, blank=True)

    objects = TenantOwnedQuerySet.as_manager()

    class Meta:
        indexes = [
            models.Index(
                fields=["created_at"],
                condition=Q(status__in=["on_hold", "shredded"]),
                name="deletion_request_open",
            )
        ]
        ordering = ["-created_at"]

    def __str__(self) -> str:
        what = self.thread_ref or "a data subject"
        return f"deletion of {what} ({self.status})"

    @property
    def is_open(self) -> bool:
        return self.status in self.OPEN

    @property
    def outcome(self) -> str:
        """The record in a sentence, for the person reading the request."""
        record = self.record or {}
        held = record.get("threads_on_hold", 0)
        if record.get("threads_found") == 0:
            return "No thread matched: nothing was deleted."
        if self.status == self.Status.COMPLETED:
            removed = record.get("threads_removed", 0)
            rows = ", ".join(
                f"{count} {kind.replace('_', ' ')}"
                for kind, count in sorted(record.get("removed", {}).items())
                if count
            )
            return f"{removed} thread(s) removed" + (f" ({rows})." if rows else ".")
        if self.status == self.Status.ON_HOLD:
            return f"Waiting: {held} thread(s) under a legal hold."
        return "Keys destroyed; the rows are being removed."


class ThreadRemoval(models.Model):
    """A thread whose content retention removed: when, why and how many rows.

    One per thread, written in the removal's transaction, so a thread is
    never removed (nor its tombstone recorded) twice. The thread row itself
    stays as a tombstone.
    """

    thread = models.OneToOneField(
        Thread, on_delete=models.CASCADE, primary_key=True, related_name="removal"
    )
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    deletion_request = models.ForeignKey(
        DeletionRequest,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="removals",
    )
    reason = models.CharField(max_length=100)
    removed_at = models.DateTimeField(default=timezone.now)
    # Rows removed or cleared, by kind: {"checkpoints": 12, ...}. Never content.
    removed = models.JSONField(default=dict)

    objects = TenantOwnedQuerySet.as_manager()

    class Meta:
        ordering = ["-removed_at"]

    def __str__(self) -> str:
        return f"removal of thread {self.thread_id} ({self.reason})"
