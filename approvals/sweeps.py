"""The batch sweeps of pending approvals: what is overdue goes one hop along
its tenant's chain (approvals.policy), what can no longer be answered is
closed; and the approval e-mails still owed after a grace period are sent
(approvals.notifications.send_owed). retention's scheduled jobs run them
(retention.jobs).

Both take requests in bounded batches, locked FOR UPDATE SKIP LOCKED
(Postgres), one transaction per batch: two sweeps at once never handle one
request twice, a sweep killed midway loses only its open batch, and a
reviewer deciding a request meanwhile holds its row, so the sweep passes it
by. The lock order is the one of every approval change: the request, then
its thread (approvals.services.lifecycle).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.db import transaction

from approvals.models import ApprovalRequest
from approvals.notifications import (
    NOTICE_GRACE,
    NOTICE_MAX_AGE,
    NoticeGivenUp,
    give_up_stale,
    owed_before,
    send_owed,
)
from approvals.policy import ApprovalPolicy, next_hop, policy_for
from approvals.services import (
    approval_close,
    approval_escalate,
    approval_expire,
    orphan_reason,
)
from runs.sweeps import Sweep, SweepResult, after, isolated

# Each request's work takes up to four savepoints (its own, its audit event's,
# a resume's and that one's event); Postgres slows every session's snapshots
# once a transaction has more than 64 subtransactions.
MAX_BATCH = 15


def _batch(queryset, batch_size: int, dry_run: bool) -> list[ApprovalRequest]:
    """The next batch, locked unless this is a dry run (which changes nothing)."""
    batch_size = min(batch_size, MAX_BATCH)
    queryset = queryset.select_related("tenant", "thread", "run")
    if not dry_run:
        queryset = queryset.select_for_update(
            skip_locked=True, of=("self",), no_key=True
        )
    return list(queryset.order_by("due_at", "pk")[:batch_size])


def _describe(approval: ApprovalRequest, what: str, why: str = "") -> str:
    """A dry run's line: "remind approval <id> (tenant/thread, action)"."""
    return (
        f"{what} approval {approval.pk} ({approval.tenant.slug}/"
        f"{approval.thread.thread_id}, {approval.action})" + (f": {why}" if why else "")
    )


# What a pending request is due for: its counter, its dry-run verb and why,
# and the work (None: nothing due yet).
Due = tuple[str, str, str, Callable[[], Any]] | None


def _orphaned(approval: ApprovalRequest) -> Due:
    reason = orphan_reason(approval)
    if reason is None:
        return None
    return (
        "closed",
        "close",
        reason,
        lambda: approval_close(approval=approval, reason=reason),
    )


def _due_now(approval: ApprovalRequest, policy: ApprovalPolicy, now: datetime) -> Due:
    orphaned = _orphaned(approval)
    if orphaned is not None:
        return orphaned
    hop = next_hop(approval, policy)
    if hop.at > now:
        return None
    if hop.action == "escalate":
        return (
            f"step_{hop.step.name}",
            hop.step.name,
            "",
            lambda: approval_escalate(approval=approval, step=hop.step, now=now),
        )
    return (
        "expired",
        "expire",
        "deny and resume the run",
        lambda: approval_expire(approval=approval),
    )


def _sweep(sweep: Sweep, pending, due: Callable[[ApprovalRequest], Due]) -> SweepResult:
    """Take `pending` batch by batch and do what `due` says of each request
    (or list it, in a dry run)."""
    result = SweepResult()
    cursor = None
    while not sweep.out_of_time():
        with transaction.atomic():
            batch = _batch(
                pending.filter(after(cursor, "due_at", "pk")),
                sweep.batch_size,
                sweep.dry_run,
            )
            if not batch:
                break
            for approval in batch:
                # A broken request is counted and left as it is (its
                # savepoint rolled back); the batch goes on.
                with isolated(result, approval.tenant_id, f"approval {approval.pk}"):
                    with transaction.atomic():
                        found = due(approval)
                        if found is None:
                            continue
                        counter, what, why, work = found
                        if not sweep.dry_run:
                            work()
                    if sweep.dry_run:
                        result.plan.append(_describe(approval, what, why))
                    result.add(approval.tenant_id, counter)
            cursor = (batch[-1].due_at, batch[-1].pk)
        sweep.tick(len(batch))
    return result


def approvals_escalate(sweep: Sweep) -> SweepResult:
    """Take every pending request past its due time one hop along its chain;
    close those that can no longer be answered."""
    policies: dict[int, ApprovalPolicy] = {}

    def due(approval: ApprovalRequest) -> Due:
        if approval.tenant_id not in policies:
            policies[approval.tenant_id] = policy_for(approval.tenant)
        return _due_now(approval, policies[approval.tenant_id], sweep.now)

    pending = ApprovalRequest.objects.filter(
        status=ApprovalRequest.Status.PENDING, due_at__lte=sweep.now
    )
    result = _sweep(sweep, pending, due)
    _send_owed_notices(sweep, result)
    return result


def _send_owed_notices(sweep: Sweep, result: SweepResult) -> None:
    """Send the e-mails owed for longer than NOTICE_GRACE: those whose task
    never ran (the broker down at its send, a worker killed holding it) or
    still fails. Each in a transaction of its own (send_owed): one sent is
    never sent again for a later one's failure. One that fails (the mail
    server down) is counted as an error and tried again by the next sweep;
    one the mail server refuses for good (or Django, its subject as a header),
    or owed past NOTICE_MAX_AGE, is
    given up (deleted, logged by its ids: notices_given_up)."""
    owed = owed_before(sweep.now - NOTICE_GRACE)
    cursor = None
    while not sweep.out_of_time():
        found = (
            owed.filter(after(cursor, "created_at", "pk"))
            .order_by("created_at", "pk")
            .values_list("created_at", "pk", "tenant_id", "request_id")
            .first()
        )
        if found is None:
            break
        cursor = found[:2]
        pk, tenant_id, request_id = found[1:]
        stale = found[0] < sweep.now - NOTICE_MAX_AGE
        if sweep.dry_run:
            verb = "give up" if stale else "send"
            result.plan.append(f"{verb} notice {pk} of approval {request_id}")
            result.add(tenant_id, "notices_given_up" if stale else "notices_sent")
            continue
        with isolated(result, tenant_id, f"notice {pk} of approval {request_id}"):
            # False or None: sent or being sent by its task meanwhile.
            if stale:
                if give_up_stale(owed.filter(pk=pk)):
                    result.add(tenant_id, "notices_given_up")
                continue
            try:
                if send_owed(owed.filter(pk=pk)) is not None:
                    result.add(tenant_id, "notices_sent")
                    sweep.tick(1)
            except NoticeGivenUp:
                result.add(tenant_id, "notices_given_up")


def approvals_close_orphaned(sweep: Sweep) -> SweepResult:
    """Close pending requests whose thread, run or agent version is gone,
    whatever their due time."""
    pending = ApprovalRequest.objects.filter(status=ApprovalRequest.Status.PENDING)
    return _sweep(sweep, pending, _orphaned)
