"""Approvals nobody answers: reminded, escalated along the chain, then expired.

Each tenant's retention policy (`retention.RetentionPolicy`, looked up through
the app registry: approvals does not import retention) names the chain, for
example: remind reviewers at the due time, escalate to compliance officers
4 hours later, expire 24 hours after that. Each hop counts from the previous
hop as it actually happened (`escalated_at`), so a late sweep never shortens
the time people were given. One hop per request per sweep.

Each hop is an audit event and an e-mail to the members with the step's roles
(Django's mail framework; the console backend in the embedded mode). The final
action denies the request with a system note and resumes the run with that
denial, so the agent ends in a known state.

Requests that can no longer be answered (thread deleted, run cancelled or
failed, agent version gone) are closed with the reason instead: by the orphan
sweep, and by the escalation sweep when it meets one.

Both sweeps take requests in bounded batches, locked FOR UPDATE SKIP LOCKED
(Postgres), one transaction per batch: two sweeps at once never handle one
request twice, a sweep killed midway loses only its open batch, and a reviewer
deciding a request meanwhile holds its row, so the sweep passes it by. The
lock order is the one of `approval_decide`: the request, then its thread.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.apps import apps
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.mail import send_mass_mail
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from approvals.models import ApprovalRequest
from approvals.services import approval_event, approval_settle, payload_of
from audit import events
from audit.services import Actor
from runs import registry
from runs.crypto import CryptoError
from runs.errors import StateConflict
from runs.models import Membership, Run, Thread
from runs.services import run_resume

logger = logging.getLogger(__name__)

SYSTEM = Actor.system("approval escalation")
EXPIRY_NOTE = (
    "No reviewer answered this request in time; it expired and was denied by "
    "the system (retention policy of the tenant)."
)
SYSTEM_REVIEWER = "system (expired)"
ENDED_RUN_STATUSES = (Run.Status.CANCELLED, Run.Status.FAILED)


@dataclass
class SweepResult:
    """Counts per tenant id, and what a dry run would have done."""

    counts: dict[int, Counter] = field(default_factory=lambda: defaultdict(Counter))
    plan: list[str] = field(default_factory=list)

    def add(self, tenant_id: int, name: str, amount: int = 1) -> None:
        self.counts[tenant_id][name] += amount


def policy_for(tenant):
    """The tenant's retention policy (its defaults when it has none)."""
    return apps.get_model("retention", "RetentionPolicy").for_tenant(tenant)


# --- what is due ---------------------------------------------------------------


@dataclass(frozen=True)
class Hop:
    """The next thing to happen to a pending request, and when."""

    action: str  # "escalate" or "expire"
    at: datetime
    step: Any = None  # retention.models.EscalationStep for "escalate"


def next_hop(approval: ApprovalRequest, policy) -> Hop:
    steps = policy.escalation_steps()
    level = approval.escalation_level
    since = (
        approval.escalated_at if level and approval.escalated_at else approval.due_at
    )
    if level < len(steps):
        step = steps[level]
        return Hop(action="escalate", at=since + step.after, step=step)
    return Hop(action="expire", at=since + policy.expire_after)


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


# --- the hops --------------------------------------------------------------------


def _recipients(tenant_id: int, roles: tuple[str, ...]) -> list[str]:
    users = get_user_model().objects.filter(
        is_active=True,
        pk__in=Membership.objects.filter(tenant_id=tenant_id, role__in=roles).values(
            "user_id"
        ),
    )
    return sorted({email for email in users.values_list("email", flat=True) if email})


def _notice(approval: ApprovalRequest, step, recipients: list[str]):
    """One message per recipient: ids, action and risk only, no content."""
    link = (
        f"{settings.GATEHOUSE_BASE_URL.rstrip('/')}/admin/approvals/"
        f"approvalrequest/{approval.pk}/change/"
    )
    subject = (
        f"[Gatehouse] {step.name}: {approval.action} ({approval.risk} risk) "
        f"waiting since {approval.created_at:%Y-%m-%d %H:%M} UTC"
    )
    body = "\n".join(
        [
            f"An approval request of tenant {approval.tenant.slug} is unanswered.",
            "",
            f"Action: {approval.action} (risk {approval.risk})",
            f"Thread: {approval.thread.thread_id}",
            f"Requested: {approval.created_at.isoformat()}",
            f"Due: {approval.due_at.isoformat()}",
            f"Step: {step.name} (level {step.level})",
            "",
            f"Review it: {link}",
            "",
            "If nobody answers, the request expires and is denied by the system.",
        ]
    )
    sender = settings.DEFAULT_FROM_EMAIL
    return [(subject, body, sender, [address]) for address in recipients]


def _send(messages: list) -> None:
    try:
        send_mass_mail(messages, fail_silently=False)
    except Exception:  # a mail server down must not undo the hop
        logger.exception("escalation notices could not be sent")


def approval_escalate(
    *, approval: ApprovalRequest, step, now: datetime | None = None
) -> ApprovalRequest:
    """Record one hop of the chain and notify the step's roles (after commit).

    Call with the request locked.
    """
    now = now or timezone.now()
    approval.escalation_level = step.level
    approval.escalated_at = now
    approval.save(update_fields=["escalation_level", "escalated_at"])
    recipients = _recipients(approval.tenant_id, step.notify)
    approval_event(
        approval=approval,
        kind=events.APPROVAL_ESCALATED,
        actor=SYSTEM,
        step=step.name,
        level=step.level,
        notify=list(step.notify),
        notified=len(recipients),
    )
    if recipients:
        messages = _notice(approval, step, recipients)
        transaction.on_commit(lambda: _send(messages))
    return approval


def approval_close(
    *, approval: ApprovalRequest, reason: str, actor: Actor = SYSTEM
) -> ApprovalRequest:
    """Close a pending request that can no longer be answered. Call it locked."""
    approval.status = ApprovalRequest.Status.CANCELLED
    approval.decided_at = timezone.now()
    approval.save(update_fields=["status", "decided_at"])
    approval_event(
        approval=approval, kind=events.APPROVAL_CLOSED, actor=actor, reason=reason[:200]
    )
    return approval


def approvals_close_for_thread(*, thread, actor: Actor, reason: str) -> int:
    """Close the thread's pending requests, in the caller's transaction: its
    interrupts will never be resumed (the thread was closed)."""
    pending = ApprovalRequest.objects.select_for_update(of=("self",)).filter(
        thread_id=thread.pk, status=ApprovalRequest.Status.PENDING
    )
    closed = 0
    for approval in pending.select_related("tenant", "thread"):
        approval_close(approval=approval, reason=reason, actor=actor)
        closed += 1
    return closed


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
    resume_value = {
        "approved": False,
        "note": note,
        "reviewer": SYSTEM_REVIEWER,
        "approval_id": str(approval.pk),
        "args": payload["args"],
        "edits": [],
    }
    try:
        with transaction.atomic():
            # Settled first: the gate opens only for the value stored with it.
            approval_settle(
                approval=approval,
                status=ApprovalRequest.Status.EXPIRED,
                resume_value=resume_value,
            )
            run = run_resume(
                thread=approval.thread,
                resume={approval.interrupt_id: resume_value},
                actor=SYSTEM,
                behind_active_run=True,
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
    return approval, run


# --- the sweeps ---------------------------------------------------------------------


# Each request's work takes up to four savepoints (its own, its audit event's,
# a resume's and that one's event); Postgres slows every session's snapshots
# once a transaction has more than 64 subtransactions.
MAX_BATCH = 15


def _batch(queryset, batch_size: int, dry_run: bool) -> list[ApprovalRequest]:
    """The next batch, locked unless this is a dry run (which changes nothing)."""
    batch_size = min(batch_size, MAX_BATCH)
    queryset = queryset.select_related("tenant", "thread", "run")
    if not dry_run:
        queryset = queryset.select_for_update(skip_locked=True, of=("self",))
    return list(queryset.order_by("due_at", "pk")[:batch_size])


def _after(cursor: tuple | None) -> Q:
    if cursor is None:
        return Q()
    due_at, pk = cursor
    return Q(due_at__gt=due_at) | Q(due_at=due_at, pk__gt=pk)


def _out_of_time(deadline: float | None) -> bool:
    return deadline is not None and time.monotonic() > deadline


def _guarded(
    result: SweepResult, approval: ApprovalRequest, counter: str, work: Callable
) -> None:
    """One request's work in a savepoint: a broken row is counted, not fatal."""
    try:
        with transaction.atomic():
            work()
    except Exception:
        logger.exception("approval %s: sweep failed on it; left as it is", approval.pk)
        result.add(approval.tenant_id, "errors")
    else:
        result.add(approval.tenant_id, counter)


def _due_action(approval: ApprovalRequest, policy, now: datetime) -> tuple[str, Any]:
    """("close", reason), ("escalate", step), ("expire", None) or ("", None)."""
    reason = orphan_reason(approval)
    if reason is not None:
        return "close", reason
    hop = next_hop(approval, policy)
    if hop.at > now:
        return "", None
    return hop.action, hop.step


def _describe(approval: ApprovalRequest, what: str, why: str = "") -> str:
    """A dry run's line: "remind approval <id> (tenant/thread, action)"."""
    return (
        f"{what} approval {approval.pk} ({approval.tenant.slug}/"
        f"{approval.thread.thread_id}, {approval.action})" + (f": {why}" if why else "")
    )


def approvals_escalate(
    *,
    now: datetime | None = None,
    batch_size: int = 50,
    dry_run: bool = False,
    deadline: float | None = None,
    progress: Callable[[int], None] | None = None,
) -> SweepResult:
    """Take every pending request past its due time one hop along its chain."""
    now = now or timezone.now()
    result = SweepResult()
    policies: dict[int, Any] = {}
    pending = ApprovalRequest.objects.filter(
        status=ApprovalRequest.Status.PENDING, due_at__lte=now
    )
    cursor = None
    while not _out_of_time(deadline):
        with transaction.atomic():
            batch = _batch(pending.filter(_after(cursor)), batch_size, dry_run)
            if not batch:
                break
            for approval in batch:
                if approval.tenant_id not in policies:
                    policies[approval.tenant_id] = policy_for(approval.tenant)
                action, detail = _due_action(
                    approval, policies[approval.tenant_id], now
                )
                if action == "close":
                    counter, what, why = "closed", "close", detail
                elif action == "escalate":
                    counter, what, why = f"step_{detail.name}", detail.name, ""
                elif action == "expire":
                    counter, what = "expired", "expire"
                    why = "deny and resume the run"
                else:
                    continue
                if dry_run:
                    result.add(approval.tenant_id, counter)
                    result.plan.append(_describe(approval, what, why))
                    continue

                def work(approval=approval, action=action, detail=detail):
                    if action == "close":
                        approval_close(approval=approval, reason=detail)
                    elif action == "escalate":
                        approval_escalate(approval=approval, step=detail, now=now)
                    else:
                        approval_expire(approval=approval)

                _guarded(result, approval, counter, work)
            cursor = (batch[-1].due_at, batch[-1].pk)
        if progress is not None:
            progress(len(batch))
    return result


def approvals_close_orphaned(
    *,
    batch_size: int = 50,
    dry_run: bool = False,
    deadline: float | None = None,
    progress: Callable[[int], None] | None = None,
) -> SweepResult:
    """Close pending requests whose thread, run or agent version is gone."""
    result = SweepResult()
    pending = ApprovalRequest.objects.filter(status=ApprovalRequest.Status.PENDING)
    cursor = None
    while not _out_of_time(deadline):
        with transaction.atomic():
            batch = _batch(pending.filter(_after(cursor)), batch_size, dry_run)
            if not batch:
                break
            for approval in batch:
                reason = orphan_reason(approval)
                if reason is None:
                    continue
                if dry_run:
                    result.add(approval.tenant_id, "closed")
                    result.plan.append(_describe(approval, "close", reason))
                    continue

                def work(approval=approval, reason=reason):
                    approval_close(approval=approval, reason=reason)

                _guarded(result, approval, "closed", work)
            cursor = (batch[-1].due_at, batch[-1].pk)
        if progress is not None:
            progress(len(batch))
    return result
