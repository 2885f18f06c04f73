"""Reads of approval requests, decrypted for those allowed to see them."""

from __future__ import annotations

from approvals.edits import args_diff
from approvals.models import ApprovalRequest
from approvals.services import current_args, decision_detail, payload_of
from runs.crypto import ThreadCipher


def approval_view(request: ApprovalRequest) -> ApprovalRequest:
    """The request with `payload`, the current `args` and their `edits`, and
    `decisions_shown`, decrypted for display."""
    cipher = ThreadCipher.for_thread(request.thread)
    request.payload = payload_of(request, cipher)
    decisions = list(request.decisions.all())
    request.args = current_args(request.payload["args"], decisions, cipher)
    request.edits = args_diff(request.payload["args"], request.args)
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
