"""The reviewer's desk: who opened a request, what they saw, who it is assigned to.

Imported by `approvals.models`, so that Django registers these models with the
approvals app; they name that module's models by label, so this module does
not import it back. The desk's cards are `approvals.cards`, its writes
`approvals.services.desk`.

A card is the request page as a reviewer saw it: a mapping of the fields shown
(action, args, reason, context, earlier decisions, ...). It holds what the
agent and the customer wrote, so it is stored as ciphertext of the thread's
key, like the payload it was built from, and is shredded with the thread. Its
`content_hash` is the SHA-256 of its canonical JSON (`approvals.cards.card_hash`),
so an auditor can check that a decrypted card is the one that was hashed.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.utils import timezone

from runs.models import Tenant, TenantOwnedQuerySet, ThreadContent


class RequestOpening(models.Model):
    """A reviewer opened a request's page: when, and the card they were shown.

    The first opening by a reviewer starts the clock of the dashboard's time
    from opening to deciding; the decision names the opening whose card it
    was taken on, and that card becomes the decision's snapshot.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    request = models.ForeignKey(
        "approvals.ApprovalRequest", on_delete=models.CASCADE, related_name="openings"
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+"
    )
    opened_at = models.DateTimeField(default=timezone.now)
    content_hash = models.CharField(max_length=64)
    # Ciphertext of the card's fields, bound to this row.
    card = models.BinaryField(editable=False)

    objects = TenantOwnedQuerySet.as_manager()

    # Cleared when the thread is removed (runs.storage.content_clear).
    thread_content = (
        ThreadContent(
            "reviewer_cards", fields=("card",), empty=b"", thread="request__thread"
        ),
    )

    class Meta:
        indexes = [
            models.Index(
                fields=["request", "user", "opened_at"], name="opening_request_user"
            )
        ]
        ordering = ["opened_at"]

    def __str__(self) -> str:
        return f"request {self.request_id} opened by user {self.user_id}"


class DecisionSnapshot(models.Model):
    """What the reviewer was looking at when they decided: the card, as shown.

    Decisions taken through the REST API have none: no card was rendered.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    decision = models.OneToOneField(
        "approvals.Decision", on_delete=models.CASCADE, related_name="snapshot"
    )
    opening = models.ForeignKey(
        RequestOpening, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    # When this reviewer first opened the request, and when the card decided
    # on was rendered.
    first_opened_at = models.DateTimeField()
    rendered_at = models.DateTimeField()
    content_hash = models.CharField(max_length=64)
    # Ciphertext of the card's fields, bound to this row.
    card = models.BinaryField(editable=False)
    created_at = models.DateTimeField(default=timezone.now)

    # Cleared when the thread is removed (runs.storage.content_clear).
    thread_content = (
        ThreadContent(
            "decision_cards",
            fields=("card",),
            empty=b"",
            thread="decision__request__thread",
        ),
    )

    class Meta:
        ordering = ["created_at"]

    def __str__(self) -> str:
        return f"card {self.content_hash[:12]} of decision {self.decision_id}"


class Assignment(models.Model):
    """The reviewer a compliance officer assigned a pending request to."""

    request = models.OneToOneField(
        "approvals.ApprovalRequest",
        on_delete=models.CASCADE,
        related_name="assignment",
    )
    assignee = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+"
    )
    assigned_by = models.CharField(max_length=200)
    assigned_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [models.Index(fields=["assignee"], name="assignment_assignee")]

    def __str__(self) -> str:
        return f"request {self.request_id} assigned to user {self.assignee_id}"
