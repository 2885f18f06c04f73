"""Reads of approval requests, decrypted for those allowed to see them."""

from __future__ import annotations

from approvals.models import ApprovalRequest
from approvals.services import decision_detail, payload_of
from runs.crypto import ThreadCipher


def approval_view(request: ApprovalRequest) -> ApprovalRequest:
    """The request with `payload` and `decisions` decrypted for display."""
    cipher = ThreadCipher.for_thread(request.thread)
    request.payload = payload_of(request, cipher)
    decisions = []
    for decision in request.decisions.all():
        detail = decision_detail(decision, cipher)
        decisions.append(
            {
                "reviewer_label": decision.reviewer_label,
                "approved": decision.approved,
                "note": detail["note"],
                "args": detail["args"],
                "created_at": decision.created_at,
            }
        )
    request.decisions_shown = decisions
    return request
