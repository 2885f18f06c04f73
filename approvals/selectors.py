"""Reads of approval requests, decrypted for those allowed to see them, and
of the people and openings around them."""

from __future__ import annotations

import uuid

from django.contrib.auth import get_user_model

from approvals.content import decision_detail, payload_of
from approvals.desk_models import RequestOpening
from approvals.models import ApprovalRequest, Decision
from approvals.plans import request_diff
from approvals.reviewers import current_args
from runs import permissions
from runs.crypto import ThreadCipher
from runs.fixed_queries import FixedQuery

# A request's decisions, oldest first (Decision's ordering): on every decision
# and detail read, so one statement compiled once per process
# (runs.fixed_queries).
_DECISIONS = FixedQuery(
    lambda request_id: Decision.objects.filter(request_id=request_id),
    uuid.UUID("5a3b1e00-0000-4000-8000-0000000dec15"),
)


def decisions_of(
    request: ApprovalRequest, read: list[Decision] | None = None
) -> list[Decision]:
    """`request.decisions.all()`, each decision pointing at `request` (as the
    related manager's would). `read`: what `decisions_query(request.pk)`
    answered, run by the caller in this transaction after it locked the
    request (with the lock: runs.fixed_queries.together)."""
    decisions = _DECISIONS(request.pk) if read is None else read
    for decision in decisions:
        decision.request = request
    return decisions


def decisions_query(request_id: uuid.UUID) -> tuple:
    """The read of decisions_of, as a call for runs.fixed_queries.together."""
    return _DECISIONS, (request_id,)


def approval_view(
    request: ApprovalRequest, decisions: list | None = None
) -> ApprovalRequest:
    """The request with `payload`, the current `args` and their `edits`, and
    `decisions_shown`, decrypted for display. `decisions`: its decisions in
    order, when the caller has them (a decision just taken), else read."""
    cipher = ThreadCipher.for_thread(request.thread)
    request.payload = payload_of(request, cipher)
    if decisions is None:
        decisions = decisions_of(request)
    request.args = current_args(request.payload["args"], decisions, cipher)
    request.edits = request_diff(request, request.payload["args"], request.args)
    shown = []
    for decision in decisions:
        detail = decision_detail(decision, cipher)
        shown.append(
            {
                "reviewer": decision.reviewer_label,
                "unverified_label": decision.claimed_label,
                "via_key": decision.reviewer_key_prefix,
                "approved": decision.approved,
                "note": detail["note"],
                "args": detail["args"],
                "edits": detail.get("edits", []),
                "created_at": decision.created_at,
            }
        )
    request.decisions_shown = shown
    return request


def decider_choices(tenant_id: int):
    """The people who may decide a tenant's requests (for reassignment)."""
    return (
        get_user_model()
        .objects.filter(
            is_active=True,
            memberships__tenant_id=tenant_id,
            memberships__role__in=permissions.roles_with(permissions.DECIDE),
        )
        .order_by("username")
    )


def opening_for(
    *, approval: ApprovalRequest, user, opening_id
) -> RequestOpening | None:
    """The user's own opening of this request, or None (an old or forged id)."""
    if not opening_id:
        return None
    return RequestOpening.objects.filter(
        pk=opening_id, request=approval, user=user
    ).first()
