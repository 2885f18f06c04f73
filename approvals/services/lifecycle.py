"""What every step of an approval's life shares: its audit event, the lock
taken before a change, the value that resumes its interrupt, settling and
closing.

The lock order everywhere: the request, then its thread, and the tenant's
audit sequence last (`record()` takes it). A worker claiming or finishing a
run of the thread holds the thread while it records; taking the sequence
first here would deadlock with it.

Rows are locked FOR NO KEY UPDATE (`no_key=True`), and only their own table
(`of`, or a query without joins): a plain FOR UPDATE also blocks the foreign
key checks of other transactions, which Postgres makes at their COMMIT,
after they have taken the audit sequence (Django's foreign keys are
deferred): a request or thread row held FOR UPDATE here while this
transaction waits for the sequence is a deadlock with any transaction that
recorded an event and inserted a row pointing at it (an opening, a run, a
tool call, the audit event's own tenant).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.utils import timezone

from approvals.content import resume_row
from approvals.models import ApprovalRequest
from audit import events
from audit.services import Actor, Write, record, record_with_write
from runs.crypto import ThreadCipher
from runs.errors import StateConflict
from runs.fixed_queries import save_fields
from runs.models import Run
from runs.services import run_resume, run_resume_locked, thread_locked

SYSTEM = Actor.system("approval escalation")


def _about(
    *, approval: ApprovalRequest, kind, actor: Actor, run_id=None, **data
) -> dict[str, Any]:
    """record()'s keywords for an event about the request: every such event
    names the request, its thread, run and action."""
    return {
        "tenant": approval.tenant,
        "kind": kind,
        "actor": actor,
        "thread_id": approval.thread.thread_id,
        "run_id": str(run_id or approval.run_id),
        "action": approval.action,
        "data": {"approval_id": str(approval.pk), "action": approval.action, **data},
    }


def approval_event(
    *,
    approval: ApprovalRequest,
    kind,
    actor: Actor,
    run_id=None,
    writes: Sequence[Write] = (),
    read_by: Actor | None = None,
    **data,
) -> list[tuple]:
    """Record an event about an approval request, in the caller's transaction.
    With `writes` (each SQL and its parameters, with RETURNING), the writes it
    records, in one statement with it where they can be
    (audit.services.record_with_write): the rows the first write returned;
    none, and no event, if one write returned none. `read_by`: the caller
    answers with the request's content, which `read_by` reads
    (approval_read, how "decision"): that event is recorded next, with it."""
    about = _about(approval=approval, kind=kind, actor=actor, run_id=run_id, **data)
    read = [_read(approval, read_by, "decision")] if read_by is not None else []
    if writes:
        return record_with_write(*writes, then=read, **about)[1]
    for keywords in (about, *read):
        record(**keywords)
    return []


def _read(
    approval: ApprovalRequest, actor: Actor, how: str, checkpoint_id: str = ""
) -> dict[str, Any]:
    return _about(
        approval=approval,
        kind=events.APPROVAL_READ,
        actor=actor,
        how=how,
        checkpoint_id=checkpoint_id,
    )


def approval_read(
    *, approval: ApprovalRequest, actor: Actor, how: str, checkpoint_id: str = ""
) -> None:
    """Audit one `approval.read` event for a response that decrypts the
    request's content: `how` says which ("detail" and "decision" over the
    API: the decision's is recorded with it, approval_event's `read_by`;
    "card" on the desk, which also shows the thread's state at
    `checkpoint_id`)."""
    record(**_read(approval, actor, how, checkpoint_id))


def approval_payloads_read(*, approvals: list[ApprovalRequest], actor: Actor) -> None:
    """Audit a page that decrypted the payloads of `approvals` (the desk's
    queue): one `approval.list_read` event per tenant, naming the requests."""
    by_tenant: dict[int, list[ApprovalRequest]] = {}
    for approval in approvals:
        by_tenant.setdefault(approval.tenant_id, []).append(approval)
    for shown in by_tenant.values():
        record(
            tenant=shown[0].tenant,
            kind=events.APPROVALS_READ,
            actor=actor,
            data={
                "count": len(shown),
                "approval_ids": [str(approval.pk) for approval in shown[:100]],
            },
        )


def locked_pending(
    approval: ApprovalRequest, *, already_locked: bool = False
) -> ApprovalRequest:
    """The request locked, then its thread locked (the lock order above);
    StateConflict `already_decided` unless it is still pending. Call it in a
    transaction: of concurrent callers one goes ahead, the others wait and
    then see what the first one did. `already_locked`: `approval` and its
    thread were read locked in this transaction already, in this order, by one
    statement (FOR NO KEY UPDATE OF both rows), with their tenants, and are
    not read again."""
    locked = approval
    if not already_locked:
        locked = (
            ApprovalRequest.objects.select_related("tenant")
            .select_for_update(of=("self",), no_key=True)
            .get(pk=approval.pk)
        )
    if not locked.is_pending:
        raise StateConflict(
            f"this request is already {locked.status}", code="already_decided"
        )
    if already_locked:
        return locked
    # The thread's row alone, FOR NO KEY UPDATE (see the module's docstring):
    # locking the tenant's row too would deadlock with every insert that
    # references the tenant, checked (FOR KEY SHARE) at its commit while it
    # holds the tenant's audit sequence. Read with the lock, so
    # `locked.thread` is current: resuming its run (approval_resolve with
    # thread_locked=True) reads it no second time.
    locked.thread = thread_locked(locked.thread_id)
    return locked


def resume_value(
    *,
    approval: ApprovalRequest,
    approved: bool,
    note: str,
    reviewer: str,
    args: dict[str, Any],
    edits: list[dict[str, Any]],
) -> dict[str, Any]:
    """What the gate's `interrupt()` returns to the agent: the verdict, why,
    who, and the arguments it may act on (approved, possibly edited)."""
    return {
        "approved": approved,
        "note": note,
        "reviewer": reviewer,
        "approval_id": str(approval.pk),
        "args": args,
        "edits": edits,
    }


# What settling a request changes on its row.
SETTLED_FIELDS = ("status", "decided_at", "resume_value")


def approval_settled(
    *, approval: ApprovalRequest, status: str, resume_value: dict[str, Any]
) -> tuple[str, ...]:
    """Mark the (locked) request settled and seal the value that resumes its
    interrupt, in memory: the gate (runs.gates) opens only for that value,
    once saved (approval_settle). The fields to save."""
    cipher = ThreadCipher.for_thread(approval.thread)
    approval.status = status
    approval.decided_at = timezone.now()
    approval.resume_value = cipher.encrypt_value(resume_value, row=resume_row(approval))
    return SETTLED_FIELDS


def approval_settle(
    *, approval: ApprovalRequest, status: str, resume_value: dict[str, Any]
) -> None:
    """Settle the (locked) request (approval_settled) and save it."""
    save_fields(
        approval,
        approval_settled(approval=approval, status=status, resume_value=resume_value),
    )


def approval_resolve(
    *,
    approval: ApprovalRequest,
    status: str,
    value: dict[str, Any],
    actor: Actor,
    thread_locked: bool = False,
) -> Run:
    """Settle the (locked) request and resume its run with `value`, in the
    caller's transaction: settled first, since the gate opens only for the
    value stored with it (approval_resume)."""
    approval_settle(approval=approval, status=status, resume_value=value)
    return approval_resume(
        approval=approval, value=value, actor=actor, thread_locked=thread_locked
    )


def approval_resume(
    *,
    approval: ApprovalRequest,
    value: dict[str, Any],
    actor: Actor,
    thread_locked: bool = False,
) -> Run:
    """Resume the run of a request settled with `value` in the caller's
    transaction (its row saved settled first). A run of the thread still
    executing is queued behind, so no decision is lost. `thread_locked`: the
    request came from `locked_pending`, whose thread is locked and current.
    The gate is told the value just settled (`settled`) rather than reading
    it back."""
    resume = run_resume_locked if thread_locked else run_resume
    answer = {approval.interrupt_id: value}
    return resume(
        thread=approval.thread,
        resume=answer,
        actor=actor,
        behind_active_run=True,
        settled=answer,
    )


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
    pending = ApprovalRequest.objects.select_for_update(
        of=("self",), no_key=True
    ).filter(thread_id=thread.pk, status=ApprovalRequest.Status.PENDING)
    closed = 0
    for approval in pending.select_related("tenant", "thread"):
        approval_close(approval=approval, reason=reason, actor=actor)
        closed += 1
    return closed
