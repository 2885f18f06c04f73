"""Approval use cases: open requests for interrupts, and decide them."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.apps import apps
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from approvals import payload as payload_contract
from approvals.models import ApprovalRequest, Decision, Risk
from audit import events
from audit.redaction import describe
from audit.services import Actor, record
from runs import registry
from runs.crypto import ThreadCipher
from runs.errors import InvalidRequest, StateConflict
from runs.gates import is_gate
from runs.models import Run
from runs.services import run_resume
from runs.signals import InterruptRejected


@dataclass(frozen=True)
class Reviewer:
    """Who decides: a person, or an API key acting for a named person."""

    identity: str  # distinct per person: two decisions need two identities
    label: str
    actor: Actor
    user: Any = None
    key_prefix: str = ""

    @classmethod
    def for_user(cls, user) -> Reviewer:
        return cls(
            identity=f"user:{user.pk}",
            label=user.get_username(),
            actor=Actor.user(user),
            user=user,
        )

    @classmethod
    def for_api_key(cls, api_key, on_behalf_of: str = "") -> Reviewer:
        on_behalf_of = on_behalf_of.strip()
        label = on_behalf_of or f"key {api_key.prefix}"
        return cls(
            identity=f"key:{api_key.prefix}:{on_behalf_of.lower()}",
            label=label[:200],
            actor=Actor.api_key(api_key, on_behalf_of=on_behalf_of),
            key_prefix=api_key.prefix,
        )


def approval_event(
    *, approval: ApprovalRequest, kind, actor: Actor, run_id=None, **data
) -> None:
    """Record an event about an approval request, in the caller's transaction:
    every such event names the request, its thread, run and action."""
    record(
        tenant=approval.tenant,
        kind=kind,
        actor=actor,
        thread_id=approval.thread.thread_id,
        run_id=str(run_id or approval.run_id),
        action=approval.action,
        data={"approval_id": str(approval.pk), "action": approval.action, **data},
    )


def approval_read(*, approval: ApprovalRequest, actor: Actor) -> None:
    """Audit one `approval.read` event for a response that decrypts the
    request's payload (its detail over the API)."""
    approval_event(approval=approval, kind=events.APPROVAL_READ, actor=actor)


def _payload_row(request: ApprovalRequest) -> tuple:
    return ("approval-payload", str(request.id))


def _decision_row(decision: Decision) -> tuple:
    return ("approval-decision", str(decision.id))


def _resume_row(request: ApprovalRequest) -> tuple:
    return ("approval-resume", str(request.id))


def payload_of(request: ApprovalRequest, cipher: ThreadCipher | None = None) -> dict:
    cipher = cipher or ThreadCipher.for_thread(request.thread)
    return cipher.decrypt_value(request.payload, row=_payload_row(request))


def resume_value_of(request: ApprovalRequest, cipher: ThreadCipher) -> Any:
    """The value a settled request resumes its interrupt with."""
    return cipher.decrypt_value(request.resume_value, row=_resume_row(request))


def approval_settle(
    *, approval: ApprovalRequest, status: str, resume_value: dict[str, Any]
) -> None:
    """Mark the (locked) request settled and store the value that resumes its
    interrupt; call it before `run_resume`, in the same transaction: the gate
    (runs.gates) opens only for that value."""
    cipher = ThreadCipher.for_thread(approval.thread)
    approval.status = status
    approval.decided_at = timezone.now()
    approval.resume_value = cipher.encrypt_value(
        resume_value, row=_resume_row(approval)
    )
    approval.save(update_fields=["status", "decided_at", "resume_value"])


def decision_detail(decision: Decision, cipher: ThreadCipher) -> dict:
    return cipher.decrypt_value(decision.detail, row=_decision_row(decision))


def _due_in(risk: str, tenant=None) -> timedelta:
    """The tenant's retention policy decides; settings when it has none."""
    if tenant is not None:
        # Looked up lazily: approvals does not import retention.
        policy_model = apps.get_model("retention", "RetentionPolicy")
        policy = policy_model.objects.filter(tenant=tenant).first()
        if policy is not None:
            return policy.approval_due_in(risk)
    hours = settings.GATEHOUSE_APPROVAL_DUE_HOURS
    return timedelta(hours=hours.get(risk, hours[Risk.MEDIUM]))


def _safe_args(thread) -> frozenset[str]:
    try:
        return registry.get(thread.agent_name, thread.agent_version).safe_args
    except registry.UnknownAgent:
        return frozenset()


def approval_requests_open(*, run: Run, interrupts: list) -> list[ApprovalRequest]:
    """One pending request per approval gate among a run's interrupts (input
    interrupts are the client's to answer); InterruptRejected if a gate's
    payload breaks the contract (the run then fails with that message)."""
    parsed = []
    for interrupt in filter(lambda interrupt: is_gate(interrupt.value), interrupts):
        try:
            parsed.append((interrupt, payload_contract.parse(interrupt.value)))
        except payload_contract.InvalidPayload as exc:
            raise InterruptRejected(str(exc)) from None
    thread = run.thread
    cipher = ThreadCipher.for_thread(thread)
    safe_args = _safe_args(thread)
    opened = []
    for interrupt, payload in parsed:
        if ApprovalRequest.objects.filter(
            thread=thread, interrupt_id=interrupt.id
        ).exists():
            continue  # still waiting from an earlier run of the thread
        request = ApprovalRequest(
            tenant=thread.tenant,
            thread=thread,
            run=run,
            interrupt_id=interrupt.id,
            gate=payload.gate,
            risk=payload.risk,
            action=payload.action,
            required_approvals=2 if payload.risk == Risk.HIGH else 1,
            due_at=timezone.now() + _due_in(payload.risk, thread.tenant),
        )
        request.payload = cipher.encrypt_value(
            payload.as_dict(), row=_payload_row(request)
        )
        request.save()
        approval_event(
            approval=request,
            kind=events.APPROVAL_REQUESTED,
            actor=Actor.agent(thread.agent_name),
            risk=payload.risk,
            gate=payload.gate,
            args=describe(payload.args, safe_keys=safe_args),
        )
        opened.append(request)
    return opened


@transaction.atomic
def approval_decide(
    *,
    approval: ApprovalRequest,
    reviewer: Reviewer,
    approved: bool,
    note: str = "",
    args: dict[str, Any] | None = None,
) -> tuple[ApprovalRequest, Run | None]:
    """Record one decision; the one that settles the request resumes the run.

    Exactly one outcome: the request row is locked, so of concurrent deciders
    one wins and the others get a 409.
    """
    note = (note or "").strip()
    if not approved and not note:
        raise InvalidRequest("a denial needs a note that says why", field="note")
    if args is not None and not approved:
        raise InvalidRequest("edited args go with an approval only", field="args")
    request = (
        ApprovalRequest.objects.select_related("thread", "thread__tenant", "tenant")
        .select_for_update(of=("self",))
        .get(pk=approval.pk)
    )
    if not request.is_pending:
        raise StateConflict(
            f"this request is already {request.status}", code="already_decided"
        )
    earlier = list(request.decisions.all())
    if any(_identity_of(decision) == reviewer.identity for decision in earlier):
        raise StateConflict(
            "you already approved this request; a second, different reviewer is needed",
            code="same_reviewer",
        )
    cipher = ThreadCipher.for_thread(request.thread)
    original = payload_of(request, cipher)
    decision = Decision(
        request=request,
        approved=approved,
        reviewer_user=reviewer.user,
        reviewer_key_prefix=reviewer.key_prefix,
        reviewer_label=reviewer.label,
        args_edited=args is not None and args != original["args"],
    )
    decision.detail = cipher.encrypt_value(
        {"note": note, "args": args, "identity": reviewer.identity},
        row=_decision_row(decision),
    )
    decision.save()

    approvals = sum(1 for d in earlier if d.approved) + (1 if approved else 0)
    settled = (not approved) or approvals >= request.required_approvals
    verdict = "approved" if approved else "denied"
    if approved and not settled:
        verdict = f"approved ({approvals} of {request.required_approvals})"
    safe_args = _safe_args(request.thread)
    approval_event(
        approval=request,
        kind=events.APPROVAL_DECIDED,
        actor=reviewer.actor,
        verdict=verdict,
        reviewer=reviewer.label,
        args_edited=decision.args_edited,
        **({"edited_args": describe(args, safe_keys=safe_args)} if args else {}),
    )
    if not settled:
        return request, None

    resume_value = {
        "approved": approved,
        "note": note,
        "reviewer": reviewer.label,
        "approval_id": str(request.id),
        "args": args if args is not None else original["args"],
    }
    approval_settle(
        approval=request,
        status=request.Status.APPROVED if approved else request.Status.DENIED,
        resume_value=resume_value,
    )
    run = run_resume(
        thread=request.thread,
        resume={request.interrupt_id: resume_value},
        actor=reviewer.actor,
        behind_active_run=True,
    )
    return request, run


def _identity_of(decision: Decision) -> str:
    if decision.reviewer_user_id:
        return f"user:{decision.reviewer_user_id}"
    cipher = ThreadCipher.for_thread(decision.request.thread)
    return decision_detail(decision, cipher)["identity"]
