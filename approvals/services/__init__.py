"""An approval's life: opened for a gated interrupt, decided (over the API or
at the desk), escalated, expired or closed. Every state change is here, each
with its audit event; split by subject, import from here.

Reads live beside it: approvals.selectors (requests as shown), approvals.cards
(the desk's cards), approvals.content (the encrypted values); the batch
sweeps that find overdue and orphaned requests are approvals.sweeps.
"""

from approvals.reviewers import Reviewer
from approvals.services.decisions import RequestChanged, approval_decide
from approvals.services.desk import desk_decide, opening_record, request_reassign
from approvals.services.escalation import (
    EXPIRY_NOTE,
    approval_escalate,
    approval_expire,
    orphan_reason,
    request_escalate,
)
from approvals.services.lifecycle import (
    approval_close,
    approval_event,
    approval_payloads_read,
    approval_read,
    approval_settle,
    approvals_close_for_thread,
    locked_pending,
)
from approvals.services.requests import (
    approval_interrupts_move,
    approval_requests_open,
)

__all__ = [
    "EXPIRY_NOTE",
    "RequestChanged",
    "Reviewer",
    "approval_close",
    "approval_decide",
    "approval_escalate",
    "approval_event",
    "approval_expire",
    "approval_interrupts_move",
    "approval_payloads_read",
    "approval_read",
    "approval_requests_open",
    "approval_settle",
    "approvals_close_for_thread",
    "desk_decide",
    "locked_pending",
    "opening_record",
    "orphan_reason",
    "request_escalate",
    "request_reassign",
]
