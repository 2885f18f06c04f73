"""Opening approval requests for a run's gated interrupts, and moving them
with their interrupts."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from django.utils import timezone

from approvals import payload as payload_contract
from approvals.content import payload_row
from approvals.edits import action_of, declared_risk
from approvals.models import ApprovalRequest, Gate
from approvals.plans import PlanRejected, plan_opened, plan_risk
from approvals.policy import policy_for
from approvals.queue import safe_args_text
from approvals.reviewers import REQUIRED_APPROVALS
from approvals.services.lifecycle import approval_event
from audit import events
from audit.redaction import describe
from audit.services import Actor
from runs import registry
from runs.actions import ArgsInvalid, higher_risk
from runs.crypto import ThreadCipher
from runs.fixed_queries import insert_statement, inserted, save_new
from runs.gates import is_gate
from runs.models import Run
from runs.signals import InterruptRejected


def safe_args(thread) -> frozenset[str]:
    """The arguments the thread's agent declares safe to show in the trail."""
    try:
        return registry.get(thread.agent_name, thread.agent_version).safe_args
    except registry.UnknownAgent:
        return frozenset()


def _declared_risk(thread, interrupt, payload) -> str:
    """The request's risk: the action's declared rule, never below the risk
    the agent's payload states; InterruptRejected when the arguments break
    the action's declared schema."""
    stated = payload.risk if "risk" in interrupt.value else None
    try:
        declared = declared_risk(
            action_of(thread, payload.action), payload.args, stated
        )
    except ArgsInvalid as exc:
        raise InterruptRejected(
            f"the arguments of {payload.action} break its declared schema: {exc}"
        ) from None
    return declared or payload.risk


def _plan_opened(thread, interrupt, payload):
    """A plan gate's payload with its steps numbered and judged
    (approvals.plans), and its risk: its riskiest step's, never below the
    risk the agent's payload states."""
    try:
        plan = plan_opened(thread, payload.args)
    except PlanRejected as exc:
        raise InterruptRejected(str(exc)) from None
    risk = plan_risk(plan)
    if "risk" in interrupt.value:
        risk = higher_risk(risk, payload.risk)
    return dataclasses.replace(payload, args=plan), risk


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
        if payload.gate == Gate.PLAN:
            payload, risk = _plan_opened(run.thread, interrupt, payload)
        else:
            risk = _declared_risk(run.thread, interrupt, payload)
        parsed.append((interrupt, payload, risk))
    thread = run.thread
    cipher = ThreadCipher.for_thread(thread)
    shown = safe_args(thread)
    policy = policy_for(thread.tenant) if parsed else None
    opened = []
    for interrupt, payload, risk in parsed:
        opening = _Opening(run, payload, risk, policy.due_in(risk), cipher, shown)
        # The interrupt's first request: inserted with its event in one
        # statement, unless the interrupt has one already (from an earlier
        # run), and then nothing is written.
        request = opening.pending(
            ApprovalRequest(
                tenant=thread.tenant, thread=thread, interrupt_id=interrupt.id
            )
        )
        if opening.insert(request):
            opened.append(request)
            continue
        request = ApprovalRequest.objects.get(thread=thread, interrupt_id=interrupt.id)
        if request.status != request.Status.CANCELLED:
            continue  # still waiting (or decided) from an earlier run
        # A request closed when its run failed waits again once a retry of the
        # run stops at the same interrupt: a gate is never left without one.
        opening.pending(request).save()
        opening.record(request)
        opened.append(request)
    return opened


@dataclasses.dataclass(frozen=True)
class _Opening:
    """What opening a request for one gate of a run writes, and its event."""

    run: Run
    payload: payload_contract.ApprovalPayload
    risk: str
    due_in: timedelta
    cipher: ThreadCipher
    shown: frozenset[str]

    def pending(self, request: ApprovalRequest) -> ApprovalRequest:
        """`request` waiting on the run's gate, the payload sealed to its row."""
        payload = self.payload
        request.run = self.run
        request.status = ApprovalRequest.Status.PENDING
        request.decided_at = None
        request.gate, request.action = payload.gate, payload.action
        request.risk = self.risk
        request.required_approvals = REQUIRED_APPROVALS[self.risk]
        request.due_at = timezone.now() + self.due_in
        request.payload = self.cipher.encrypt_value(
            payload.as_dict(), row=payload_row(request)
        )
        request.safe_args = safe_args_text(payload.args, self.shown)
        return request

    def insert(self, request: ApprovalRequest) -> bool:
        """Insert the interrupt's first request with its event, in one
        statement where it can be; False, and nothing written, if the
        interrupt has a request already."""
        statement = insert_statement(request, ignore_conflicts=True)
        if statement is None:  # only Model.save may insert it
            if not save_new(request, ignore_conflicts=True):
                return False
            self.record(request)
            return True
        if not self.record(request, writes=[statement]):
            return False
        inserted(request)
        return True

    def record(self, request: ApprovalRequest, writes=()) -> list[tuple]:
        """Record `approval.requested` (approval_event, with `writes`)."""
        return approval_event(
            approval=request,
            kind=events.APPROVAL_REQUESTED,
            actor=Actor.agent(self.run.thread.agent_name),
            writes=writes,
            risk=self.risk,
            gate=self.payload.gate,
            args=describe(self.payload.args, safe_keys=self.shown),
        )


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
