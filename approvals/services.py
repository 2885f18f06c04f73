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
from approvals.edits import action_of, args_diff, audit_diff_text, validated_edit
from approvals.models import ApprovalRequest, Decision, Risk
from audit import events
from audit.redaction import describe, digest
from audit.services import Actor, record
from runs import registry
from runs.actions import ArgsInvalid
from runs.crypto import ThreadCipher
from runs.errors import InvalidRequest, StateConflict
from runs.gates import is_gate
from runs.models import Run, Thread
from runs.selectors import jsonable
from runs.services import run_resume
from runs.signals import InterruptRejected

# Every service key together counts as at most one approval: none of them is
# a person, and a program holding two keys is still one program.
SERVICE_KEYS = "service keys"
REQUIRED_APPROVALS = {Risk.LOW: 1, Risk.MEDIUM: 1, Risk.HIGH: 2}


@dataclass(frozen=True)
class Reviewer:
    """Who decides: an authenticated principal.

    A person, through a session or their personal key, is `user:<pk>`; a
    service key is `key:<prefix>`, and the name it sends in `reviewer` is
    kept as its unverified `claimed_label`, never as a person.
    """

    principal: str
    label: str
    actor: Actor
    user: Any = None
    key_prefix: str = ""
    claimed_label: str = ""

    @classmethod
    def for_user(cls, user, via_key=None) -> Reviewer:
        return cls(
            principal=f"user:{user.pk}",
            label=user.get_username(),
            actor=Actor.user(user, via_key=via_key),
            user=user,
            key_prefix=via_key.prefix if via_key is not None else "",
        )

    @classmethod
    def for_service_key(cls, api_key, claimed_label: str = "") -> Reviewer:
        claimed = claimed_label.strip()[:150]
        return cls(
            principal=f"key:{api_key.prefix}",
            label=f"key {api_key.prefix}",
            actor=Actor.api_key(api_key, on_behalf_of=claimed),
            key_prefix=api_key.prefix,
            claimed_label=claimed,
        )

    @classmethod
    def for_principal(cls, principal, claimed_label: str = "") -> Reviewer:
        """The reviewer of an API request (runs.access.Principal): its person,
        or its service key."""
        if principal.user is None:
            return cls.for_service_key(principal.api_key, claimed_label)
        return cls.for_user(principal.user, via_key=principal.api_key)

    @property
    def counted_as(self) -> str:
        return counted_as(self.principal)

    @property
    def shown(self) -> str:
        if self.claimed_label:
            return f"{self.label} (unverified label “{self.claimed_label}”)"
        return self.label


def counted_as(principal: str) -> str:
    """Whom an approval counts for: a person, or all service keys as one."""
    return principal if principal.startswith("user:") else SERVICE_KEYS


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


def higher_risk(*risks: str) -> str:
    return max(risks, key=Risk.values.index)


def _declared_risk(thread, interrupt, payload) -> str:
    """The request's risk: the action's declared rule, never below the risk
    the agent's payload states; InterruptRejected when the arguments break
    the action's declared schema."""
    action = action_of(thread, payload.action)
    if action is None:
        return payload.risk
    try:
        declared = action.risk_of(action.validated(payload.args))
    except ArgsInvalid as exc:
        raise InterruptRejected(
            f"the arguments of {payload.action} break its declared schema: {exc}"
        ) from None
    if declared is None:
        return payload.risk
    stated = "risk" in interrupt.value
    return higher_risk(payload.risk, declared) if stated else declared


def approval_requests_open(*, run: Run, interrupts: list) -> list[ApprovalRequest]:
    """One pending request per approval gate among a run's interrupts (input
    interrupts are the client's to answer); InterruptRejected if a gate's
    payload breaks the contract (the run then fails with that message)."""
    parsed = []
    for interrupt in filter(lambda interrupt: is_gate(interrupt.value), interrupts):
        try:
            payload = payload_contract.parse(interrupt.value)
        except payload_contract.InvalidPayload as exc:
            raise InterruptRejected(str(exc)) from None
        risk = _declared_risk(run.thread, interrupt, payload)
        parsed.append((interrupt, payload, risk))
    thread = run.thread
    cipher = ThreadCipher.for_thread(thread)
    safe_args = _safe_args(thread)
    opened = []
    for interrupt, payload, risk in parsed:
        request = ApprovalRequest.objects.filter(
            thread=thread, interrupt_id=interrupt.id
        ).first()
        if request is not None and request.status != request.Status.CANCELLED:
            continue  # still waiting (or decided) from an earlier run
        # A request closed when its run failed waits again once a retry of the
        # run stops at the same interrupt: a gate is never left without one.
        request = request or ApprovalRequest(
            tenant=thread.tenant, thread=thread, interrupt_id=interrupt.id
        )
        request.run = run
        request.status = ApprovalRequest.Status.PENDING
        request.decided_at = None
        request.gate, request.risk, request.action = payload.gate, risk, payload.action
        request.required_approvals = REQUIRED_APPROVALS[risk]
        request.due_at = timezone.now() + _due_in(risk, thread.tenant)
        request.payload = cipher.encrypt_value(
            payload.as_dict(), row=_payload_row(request)
        )
        request.save()
        approval_event(
            approval=request,
            kind=events.APPROVAL_REQUESTED,
            actor=Actor.agent(thread.agent_name),
            risk=risk,
            gate=payload.gate,
            args=describe(payload.args, safe_keys=safe_args),
        )
        opened.append(request)
    return opened


def current_args(
    original: dict[str, Any], decisions: list[Decision], cipher: ThreadCipher
) -> dict[str, Any]:
    """The arguments a request asks approval for now: the latest approved
    edit, or the agent's."""
    for decision in reversed(decisions):
        if decision.approved and decision.args_edited:
            return decision_detail(decision, cipher)["args"]
    return original


def approves(
    decision: Decision, args: dict[str, Any], original: dict[str, Any]
) -> bool:
    """Whether the decision approved exactly `args` (decisions from before
    digests were kept approved the agent's arguments)."""
    return decision.approved and (decision.args_digest or digest(original)) == digest(
        args
    )


def counted_approvals(
    decisions: list[Decision], approved_args: dict[str, Any], original: dict[str, Any]
) -> set[str]:
    """Whom the approvals of `approved_args` count for (see counted_as):
    approvals of other arguments (before an edit) do not count."""
    return {
        counted_as(decision.principal)
        for decision in decisions
        if approves(decision, approved_args, original)
    }


def _raise_risk(request: ApprovalRequest, action, edited: dict[str, Any]) -> bool:
    """Recompute the risk from edited arguments; it and the approvals needed
    may rise, never fall. Whether they rose."""
    declared = action.risk_of(edited)
    if declared is None:
        return False
    risk = higher_risk(request.risk, declared)
    required = max(request.required_approvals, REQUIRED_APPROVALS[risk])
    if (risk, required) == (request.risk, request.required_approvals):
        return False
    request.risk, request.required_approvals = risk, required
    request.save(update_fields=["risk", "required_approvals"])
    return True


class RequestChanged(StateConflict):
    """The arguments changed (another reviewer's edit) since the deciding
    reviewer was shown them: their decision would be about something else."""

    def __init__(self, seen: dict[str, Any], current: dict[str, Any]) -> None:
        # Names the arguments, never their values: the admin shows this as a
        # message, which is stored in the session.
        changed = ", ".join(edit["arg"] for edit in args_diff(seen, current))
        super().__init__(
            f"the request changed since you opened it (another reviewer edited "
            f"{changed or 'its arguments'}); nothing was recorded: look at it "
            "again before you decide",
            code="request_changed",
        )


def _same_reviewer(reviewer: Reviewer) -> StateConflict:
    if reviewer.user is None:
        message = (
            "a service key already approved these arguments; service keys count as "
            "one approval whatever label they send: the next one must come from a "
            "person (a session or a personal key)"
        )
    else:
        message = (
            "you already approved this request; a second, different reviewer is needed"
        )
    return StateConflict(message, code="same_reviewer")


def approval_interrupts_move(*, thread, moved: dict[str, str]) -> int:
    """The thread's requests follow their interrupts to the ids a migrated
    checkpoint gives them (runs.services.migration), in the caller's
    transaction; how many requests moved."""
    return sum(
        ApprovalRequest.objects.filter(thread=thread, interrupt_id=old).update(
            interrupt_id=new
        )
        for old, new in moved.items()
    )


@transaction.atomic
def approval_decide(
    *,
    approval: ApprovalRequest,
    reviewer: Reviewer,
    approved: bool,
    note: str = "",
    args: dict[str, Any] | None = None,
    seen_args: dict[str, Any] | None = None,
) -> tuple[ApprovalRequest, Run | None]:
    """Record one decision; the one that settles the request resumes the run.

    Exactly one outcome: the request row is locked, so of concurrent deciders
    one wins and the others get a 409. An approval counts for the arguments
    it approved, once per person (all service keys together count once); an
    edit is validated against the action's declaration, needs a note, and
    may raise the risk and the approvals needed (approvals.edits).

    `seen_args` are the arguments the reviewer was shown (the desk's card):
    if another reviewer's edit changed them since, RequestChanged, and
    nothing is recorded.
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
    # The lock order everywhere: the request, its thread, and the tenant's
    # audit sequence last (record() takes it). A worker claiming or finishing
    # a run of this thread holds the thread while it records; taking the
    # sequence first here would deadlock with it.
    list(
        Thread.objects.select_for_update()
        .filter(pk=request.thread_id)
        .values_list("pk", flat=True)
    )
    cipher = ThreadCipher.for_thread(request.thread)
    original = payload_of(request, cipher)["args"]
    earlier = list(request.decisions.all())
    current = current_args(original, earlier, cipher)
    if seen_args is not None and jsonable(current) != seen_args:
        raise RequestChanged(seen_args, jsonable(current))
    action = action_of(request.thread, request.action)
    edit = validated_edit(action, current, args) if args is not None else None
    if edit is not None and not note:
        raise InvalidRequest(
            "an edit of the arguments needs a note that says why", field="note"
        )
    approved_args = edit if edit is not None else current
    counted = counted_approvals(earlier, approved_args, original)
    if approved and reviewer.counted_as in counted:
        raise _same_reviewer(reviewer)
    edits = args_diff(current, edit) if edit is not None else []
    risk_rose = _raise_risk(request, action, edit) if edit is not None else False
    decision = Decision(
        request=request,
        approved=approved,
        principal=reviewer.principal,
        reviewer_user=reviewer.user,
        reviewer_key_prefix=reviewer.key_prefix,
        reviewer_label=reviewer.label,
        claimed_label=reviewer.claimed_label,
        args_edited=edit is not None,
        args_digest=digest(approved_args) if approved else "",
    )
    decision.detail = cipher.encrypt_value(
        {"note": note, "args": edit, "edits": edits}, row=_decision_row(decision)
    )
    decision.save()

    approvals = len(counted | {reviewer.counted_as}) if approved else 0
    settled = (not approved) or approvals >= request.required_approvals
    verdict = "approved" if approved else "denied"
    if approved and not settled:
        verdict = f"approved ({approvals} of {request.required_approvals})"
    safe_args = _safe_args(request.thread)
    edit_text = ""
    if edits:
        edit_text = "; edited " + audit_diff_text(edits, safe_args, limit=150)
        if risk_rose:
            edit_text += f" (now {request.risk} risk)"
    approval_event(
        approval=request,
        kind=events.APPROVAL_DECIDED,
        actor=reviewer.actor,
        verdict=verdict,
        reviewer=reviewer.shown[:200],
        edit=edit_text[:200],
        args_edited=decision.args_edited,
        risk=request.risk,
        required_approvals=request.required_approvals,
        **({"edited_args": describe(edit, safe_keys=safe_args)} if edits else {}),
    )
    if not settled:
        return request, None

    resume_value = {
        "approved": approved,
        "note": note,
        "reviewer": reviewer.shown,
        "approval_id": str(request.id),
        "args": approved_args if approved else current,
        "edits": args_diff(original, approved_args) if approved else [],
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
