"""Approval requests (one per interrupt) and the decisions reviewers take."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Case, F, IntegerField, Q, Value, When
from django.utils import timezone

# The reviewer's desk models live in their own module; imported here so that
# Django registers them with this app.
from approvals.desk_models import (  # noqa: F401
    Assignment,
    DecisionSnapshot,
    RequestOpening,
)
from runs.models import Run, Tenant, TenantOwnedQuerySet, Thread, ThreadContent


class Risk(models.TextChoices):
    LOW = "low", "Low"
    MEDIUM = "medium", "Medium"
    HIGH = "high", "High"


class Gate(models.TextChoices):
    ACTION = "action", "Action"
    PLAN = "plan", "Plan"


# The reviewer queue's first sort key: pending requests (0) before the rest
# (1). Declared once, for the queue's ordering and for the index that serves it.
PENDING_FIRST = Case(
    When(status="pending", then=Value(0)),
    default=Value(1),
    output_field=IntegerField(),
)


class ApprovalRequest(models.Model):
    """A run waiting on a human, for one of its interrupts.

    The payload (action, args, reason, affects, if_denied) is ciphertext of the
    thread's key; `action`, `risk` and `gate` are kept in clear as well, for
    the queue's filters: they name what kind of thing is asked, not whom for.
    """

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        APPROVED = "approved", "Approved"
        DENIED = "denied", "Denied"
        EXPIRED = "expired", "Expired"
        CANCELLED = "cancelled", "Cancelled"

    # Settled by a decision (or the expiry's denial): its interrupt resumes
    # with the decision's value. A cancelled request resumes nothing.
    SETTLED = (Status.APPROVED, Status.DENIED, Status.EXPIRED)

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    thread = models.ForeignKey(
        Thread, on_delete=models.CASCADE, related_name="approval_requests"
    )
    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="approval_requests"
    )
    interrupt_id = models.CharField(max_length=64)
    gate = models.CharField(max_length=16, choices=Gate.choices, default=Gate.ACTION)
    risk = models.CharField(max_length=16, choices=Risk.choices, default=Risk.MEDIUM)
    action = models.CharField(max_length=100)
    payload = models.BinaryField(editable=False)
    # Ciphertext: the value the settled request resumed its interrupt with,
    # stored before the resume; runs.gates resumes the gate only with it.
    resume_value = models.BinaryField(null=True, editable=False)
    status = models.CharField(
        max_length=16, choices=Status.choices, default=Status.PENDING
    )
    required_approvals = models.PositiveSmallIntegerField(default=1)
    created_at = models.DateTimeField(default=timezone.now)
    due_at = models.DateTimeField()
    escalation_level = models.PositiveSmallIntegerField(default=0)
    escalated_at = models.DateTimeField(null=True, blank=True)
    decided_at = models.DateTimeField(null=True, blank=True)
    # The arguments the agent declares safe to show ("order_id=A-1001
    # amount=40.00"), in clear as in the audit trail, so that the queue can
    # find a request by its order id without decrypting every payload.
    safe_args = models.CharField(max_length=500, blank=True, default="")

    objects = TenantOwnedQuerySet.as_manager()

    # Cleared when the thread is removed (runs.storage.content_clear).
    thread_content = (
        ThreadContent("approval_payloads", fields=("payload",), empty=b""),
        ThreadContent("approval_safe_args", fields=("safe_args",), empty=""),
        ThreadContent("approval_resume_values", fields=("resume_value",)),
    )

    class Meta:
        constraints = [
            # One request per interrupt: re-delivered signals open nothing twice.
            models.UniqueConstraint(
                fields=["thread", "interrupt_id"], name="approval_thread_interrupt"
            )
        ]
        indexes = [
            models.Index(
                fields=["tenant", "due_at"],
                condition=Q(status="pending"),
                name="approval_pending_due",
            ),
            models.Index(
                fields=["tenant", "status", "created_at"], name="approval_list"
            ),
            # The reviewer queue across tenants: pending first, soonest due
            # first, in index order (the admin adds -pk for a stable order).
            models.Index(
                PENDING_FIRST, F("due_at"), F("id").desc(), name="approval_queue"
            ),
            # Waiting on a human: the oldest pending requests, and the counts
            # per tenant and age from the index alone (an index-only scan).
            models.Index(
                fields=["created_at"],
                include=["tenant", "due_at", "escalation_level"],
                condition=Q(status="pending"),
                name="approval_pending_age",
            ),
        ]
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.action} ({self.risk}, {self.status})"

    @property
    def is_pending(self) -> bool:
        return self.status == self.Status.PENDING


class Decision(models.Model):
    """One reviewer's verdict. The note and edited args are thread ciphertext."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    request = models.ForeignKey(
        ApprovalRequest, on_delete=models.CASCADE, related_name="decisions"
    )
    approved = models.BooleanField()
    # Who decided: the authenticated principal, "user:<pk>" (a session or the
    # user's personal key) or "key:<prefix>" (a service key). Approvals are
    # counted by principal, all service keys together counting as one.
    principal = models.CharField(max_length=64)
    reviewer_user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    # The key decided through: a service key, or the user's personal key.
    reviewer_key_prefix = models.CharField(max_length=16, blank=True)
    # The principal as shown: a username, or "key <prefix>".
    reviewer_label = models.CharField(max_length=200)
    # What a service key said it was deciding for: unverified, never a person.
    claimed_label = models.CharField(max_length=150, blank=True)
    # Ciphertext: {"note", "args" (the edit, or None), "edits"} bound to this
    # decision.
    detail = models.BinaryField(editable=False)
    args_edited = models.BooleanField(default=False)
    # Keyed digest (audit.redaction.digest) of the arguments approved: an
    # approval counts only for the arguments that will be executed.
    args_digest = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    # Cleared when the thread is removed (runs.storage.content_clear).
    thread_content = (
        ThreadContent(
            "decision_notes", fields=("detail",), empty=b"", thread="request__thread"
        ),
    )

    class Meta:
        ordering = ["created_at"]

    def __str__(self) -> str:
        verdict = "approved" if self.approved else "denied"
        return f"{verdict} by {self.reviewer_label}"

    @property
    def verdict(self) -> str:
        """ "approved", "approved with edits" or "denied"."""
        if not self.approved:
            return "denied"
        return "approved with edits" if self.args_edited else "approved"

    @property
    def reviewer_shown(self) -> str:
        """The reviewer as a person reads it, the unverified label marked so."""
        if self.claimed_label:
            return f"{self.reviewer_label} (unverified label “{self.claimed_label}”)"
        return self.reviewer_label


class ApprovalNotice(models.Model):
    """An approval e-mail owed to one person (approvals.notifications).

    Written in the transaction of the change it tells of, and deleted in the
    transaction that sends it, the row locked (FOR UPDATE SKIP LOCKED) from
    before the send until the delete commits: a row is a mail not yet known
    to be sent. The task `approvals.send_notice` sends it at once; the
    approvals sweep sends what is still here after NOTICE_GRACE (a message
    dropped at its send, a worker killed holding it). Subject and body are
    as rendered at the change; they never hold the customer's content.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    request = models.ForeignKey(
        ApprovalRequest, on_delete=models.CASCADE, related_name="+"
    )
    recipient = models.EmailField()
    # Whom it is for, and as which roles of the tenant (any role if empty):
    # sent only while they are still an active member with one of them
    # (approvals.notifications.send_owed); a membership removed, or a user
    # deactivated, takes their notices with it (approvals.receivers). Null
    # for notices owed before these were kept: the address is checked.
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="+",
    )
    roles = models.JSONField(default=list, blank=True)
    subject = models.TextField()
    body = models.TextField()
    created_at = models.DateTimeField(default=timezone.now)

    objects = TenantOwnedQuerySet.as_manager()

    class Meta:
        # The sweep's walk, oldest first.
        indexes = [
            models.Index(fields=["created_at", "id"], name="approval_notice_owed")
        ]

    def __str__(self) -> str:
        return f"notice {self.pk} of approval {self.request_id}"
