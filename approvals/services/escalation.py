"""Approvals nobody answers: escalated along the chain, by hand, or expired;
and requests that can no longer be answered, closed.

Each tenant's approval policy (approvals.policy) names the chain, for
example: remind reviewers at the due time, escalate to compliance officers
4 hours later, expire 24 hours after that. Each hop is an audit event and an
e-mail to the members with the step's roles (approvals.notifications). The
final action denies the request with a system note and resumes the run with
that denial, so the agent ends in a known state; the compliance officers are
told by e-mail. The batch sweeps that find what is due are
approvals.sweeps.
"""

from __future__ import annotations

import logging
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from approvals import notifications
from approvals.content import payload_of
from approvals.models import ApprovalRequest
from approvals.policy import EscalationStep, policy_for
from approvals.services.lifecycle import (
    SYSTEM,
    approval_close,
    approval_event,
    approval_resolve,
    locked_pending,
    resume_value,
)
from audit import events
from audit.services import Actor
from runs import registry
from runs.crypto import CryptoError
from runs.errors import StateConflict
from runs.models import Run, Thread

logger = logging.getLogger(__name__)

EXPIRY_NOTE = (
    "No reviewer answered this request in time; it expired and was denied by "
    "the system (retention policy of the tenant)."
)
SYSTEM_REVIEWER = "system (expired)"
ENDED_RUN_STATUSES = (Run.Status.CANCELLED, Run.Status.FAILED)


def orphan_reason(approval: ApprovalRequest) -> str | None:
    """Why the request can no longer be answered, or None if it still can."""
    thread = approval.thread
    if thread.deleted_at is not None or thread.wrapped_data_key is None:
        return "thread deleted"
    run_status = approval.run.status
    latest = (
        Run.objects.filter(thread_id=thread.pk)
        .order_by("-created_at")
        .values_list("status", flat=True)
        .first()
    )
    for status in (run_status, latest):
        if status in ENDED_RUN_STATUSES:
            return f"run {status}"
    try:
        registry.get(thread.agent_name, approval.run.agent_version)
    except registry.UnknownAgent:
        return f"agent version {thread.agent_name}@{approval.run.agent_version} gone"
    waiting = thread.status == Thread.Status.INTERRUPTED or (
        Run.objects.filter(thread_id=thread.pk, status__in=Run.ACTIVE).exists()
    )
    if not waiting:
        return "the thread no longer waits on this interrupt"
    return None


def approval_escalate(
    *, approval: ApprovalRequest, step: EscalationStep, now: datetime | None = None
) -> ApprovalRequest:
    """Record one hop of the chain and notify the step's roles (after commit).

    Call with the request locked.
    """
    now = now or timezone.now()
    approval.escalation_level = step.level
    approval.escalated_at = now
    approval.save(update_fields=["escalation_level", "escalated_at"])
    notice = notifications.notify_escalated(
        approval=approval, roles=step.notify, step=step.name, level=step.level
    )
    approval_event(
        approval=approval,
        kind=events.APPROVAL_ESCALATED,
        actor=SYSTEM,
        step=step.name,
        level=step.level,
        notify=list(step.notify),
        notified=len(notice.recipients),
    )
    return approval


@transaction.atomic
def request_escalate(*, approval: ApprovalRequest, user) -> ApprovalRequest:
    """A compliance officer raises a pending request's escalation level by
    one, now (the desk's "escalate")."""
    approval = locked_pending(approval)
    approval.escalation_level += 1
    approval.escalated_at = timezone.now()
    approval.save(update_fields=["escalation_level", "escalated_at"])
    approval_event(
        approval=approval,
        kind=events.APPROVAL_ESCALATED_MANUALLY,
        actor=Actor.user(user),
        level=approval.escalation_level,
    )
    # Told like a hop of the chain at that level: its roles (past the chain's
    # end, the last step's).
    steps = policy_for(approval.tenant).steps
    if steps:
        step = steps[min(approval.escalation_level, len(steps)) - 1]
        notifications.notify_escalated(
            approval=approval,
            roles=step.notify,
            step=f"{step.name}, by {user.get_username()}",
            level=approval.escalation_level,
        )
    return approval


def approval_expire(
    *, approval: ApprovalRequest, note: str = EXPIRY_NOTE
) -> tuple[ApprovalRequest, Run | None]:
    """The final action: deny with a system note and resume the run with it.

    Call with the request locked. A request that turns out not to be
    answerable (thread deleted or no longer waiting, version gone) is closed
    with the reason instead, and no run is resumed.
    """
    reason = orphan_reason(approval)
    if reason is None:
        try:
            payload = payload_of(approval)
        except CryptoError:
            reason = "thread deleted"
    if reason is not None:
        return approval_close(approval=approval, reason=reason), None
    try:
        with transaction.atomic():
            run = approval_resolve(
                approval=approval,
                status=ApprovalRequest.Status.EXPIRED,
                value=resume_value(
                    approval=approval,
                    approved=False,
                    note=note,
                    reviewer=SYSTEM_REVIEWER,
                    args=payload["args"],
                    edits=[],
                ),
                actor=SYSTEM,
            )
    except (StateConflict, Thread.DoesNotExist) as exc:
        approval.status, approval.decided_at = ApprovalRequest.Status.PENDING, None
        approval.resume_value = None
        reason = getattr(exc, "detail", None) or "thread no longer waiting"
        return approval_close(approval=approval, reason=str(reason)), None
    approval_event(
        approval=approval,
        kind=events.APPROVAL_EXPIRED,
        actor=SYSTEM,
        run_id=run.pk,
        level=approval.escalation_level,
        verdict="denied",
        resumed_run=str(run.pk),
    )
    notifications.notify_expired(approval=approval)
    return approval, run
