"""What the reviewer's desk changes: a reviewer opening a request (and the
card they were shown), deciding on that card, and reassigning a request.

Deciding goes through `approval_decide`, exactly as the REST decision does;
the desk adds the snapshot of the card the reviewer decided on, in the same
transaction. The cards themselves are built in approvals.cards.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import Min
from django.utils import timezone

from approvals import notifications
from approvals.cards import card_hash, opening_card
from approvals.content import card_row, snapshot_row
from approvals.desk_models import Assignment, DecisionSnapshot, RequestOpening
from approvals.models import ApprovalRequest
from approvals.reviewers import Reviewer
from approvals.selectors import decider_choices
from approvals.services.decisions import approval_decide
from approvals.services.lifecycle import approval_event, locked_pending
from audit import events
from audit.services import Actor
from runs.crypto import ThreadCipher
from runs.errors import InvalidRequest
from runs.models import Run


def opening_record(
    *, approval: ApprovalRequest, user, card: dict[str, Any]
) -> RequestOpening:
    """Record that `user` opened the request and was shown `card`."""
    opening = RequestOpening(
        tenant_id=approval.tenant_id,
        request=approval,
        user=user,
        content_hash=card_hash(card),
    )
    cipher = ThreadCipher.for_thread(approval.thread)
    opening.card = cipher.encrypt_value(card, row=card_row(opening))
    opening.save()
    return opening


@transaction.atomic
def desk_decide(
    *,
    approval: ApprovalRequest,
    user,
    opening: RequestOpening,
    approved: bool,
    note: str = "",
    args: dict[str, Any] | None = None,
    plan: dict[str, Any] | None = None,
) -> tuple[ApprovalRequest, Run | None, DecisionSnapshot]:
    """Decide through `approval_decide` and keep the card the user decided on.

    The decision is about the arguments that card showed: RequestChanged if
    an edit changed them since the page was opened. Raises what
    approval_decide raises (InvalidRequest, StateConflict); the snapshot is
    written in the same transaction as the decision.
    """
    if opening.request_id != approval.pk or opening.user_id != user.pk:
        raise InvalidRequest("this page was opened by someone else", field="opening")
    cipher = ThreadCipher.for_thread(approval.thread)
    card = opening_card(opening, cipher)
    approval, run = approval_decide(
        approval=approval,
        reviewer=Reviewer.for_user(user),
        approved=approved,
        note=note,
        args=args,
        plan=plan,
        seen_args=card["args"],
    )
    decision = approval.decisions.filter(reviewer_user=user).latest("created_at")
    first_opened = RequestOpening.objects.filter(request=approval, user=user).aggregate(
        first=Min("opened_at")
    )["first"]
    snapshot = DecisionSnapshot(
        decision=decision,
        opening=opening,
        first_opened_at=first_opened,
        rendered_at=opening.opened_at,
        content_hash=opening.content_hash,
    )
    snapshot.card = cipher.encrypt_value(card, row=snapshot_row(snapshot))
    snapshot.save()
    return approval, run, snapshot


@transaction.atomic
def request_reassign(*, approval: ApprovalRequest, assignee, user) -> Assignment:
    """Assign a pending request to one of its tenant's deciders."""
    approval = locked_pending(approval)
    if not decider_choices(approval.tenant_id).filter(pk=assignee.pk).exists():
        raise InvalidRequest(
            "assign to a reviewer or compliance officer of this tenant",
            field="assignee",
        )
    assignment, _ = Assignment.objects.update_or_create(
        request=approval,
        defaults={
            "assignee": assignee,
            "assigned_by": user.get_username(),
            "assigned_at": timezone.now(),
        },
    )
    approval_event(
        approval=approval,
        kind=events.APPROVAL_REASSIGNED,
        actor=Actor.user(user),
        assignee=assignee.get_username(),
    )
    notifications.notify_assigned(
        approval=approval, assignee=assignee, assigned_by=user.get_username()
    )
    return assignment
