"""The encrypted values of approvals: each bound to its row, sealed and
opened here with the thread's cipher.

A request's payload (what the agent asked), a decision's detail (note, edited
arguments), the value a settled request resumes its interrupt with, and the
desk's cards (what a reviewer was shown). The row binding is the associated
data of the encryption: a value copied onto another row does not decrypt.
"""

from __future__ import annotations

from typing import Any

from approvals.desk_models import DecisionSnapshot, RequestOpening
from approvals.models import ApprovalRequest, Decision
from runs.crypto import ThreadCipher


def payload_row(request: ApprovalRequest) -> tuple:
    return ("approval-payload", str(request.id))


def decision_row(decision: Decision) -> tuple:
    return ("approval-decision", str(decision.id))


def resume_row(request: ApprovalRequest) -> tuple:
    return ("approval-resume", str(request.id))


def card_row(opening: RequestOpening) -> tuple:
    return ("approval-card", str(opening.id))


def snapshot_row(snapshot: DecisionSnapshot) -> tuple:
    return ("decision-snapshot", str(snapshot.id))


def payload_of(request: ApprovalRequest, cipher: ThreadCipher | None = None) -> dict:
    cipher = cipher or ThreadCipher.for_thread(request.thread)
    return cipher.decrypt_value(request.payload, row=payload_row(request))


def resume_value_of(request: ApprovalRequest, cipher: ThreadCipher) -> Any:
    """The value a settled request resumes its interrupt with."""
    return cipher.decrypt_value(request.resume_value, row=resume_row(request))


def decision_detail(decision: Decision, cipher: ThreadCipher) -> dict:
    return cipher.decrypt_value(decision.detail, row=decision_row(decision))
