"""Deciding an approval request: the one way, for the API and the desk."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from approvals.content import decision_row, payload_of
from approvals.edits import action_of, args_diff, audit_diff_text
from approvals.models import ApprovalRequest, Decision
from approvals.plans import request_diff, request_edit, request_risk
from approvals.queue import safe_args_text
from approvals.reviewers import (
    REQUIRED_APPROVALS,
    Reviewer,
    counted_approvals,
    current_args,
)
from approvals.selectors import decisions_of
from approvals.services.lifecycle import (
    approval_event,
    approval_resume,
    approval_settled,
    locked_pending,
    resume_value,
)
from approvals.services.requests import safe_args
from audit import events
from audit.redaction import describe, digest
from audit.services import Actor
from runs.actions import higher_risk
from runs.crypto import ThreadCipher
from runs.errors import InvalidRequest, StateConflict
from runs.fixed_queries import (
    insert_statement,
    inserted,
    save_fields,
    save_new,
    update_statement,
)
from runs.models import Run
from runs.selectors import jsonable


def _raise_risk(request: ApprovalRequest, action, edited: dict[str, Any]) -> bool:
    """Recompute the risk from edited arguments (or an edited plan); it and
    the approvals needed may rise, never fall. Whether they rose."""
    declared = request_risk(request, action, edited)
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


@transaction.atomic(savepoint=False)
def approval_decide(
    *,
    approval: ApprovalRequest,
    reviewer: Reviewer,
    approved: bool,
    note: str = "",
    args: dict[str, Any] | None = None,
    plan: dict[str, Any] | None = None,
    seen_args: dict[str, Any] | None = None,
    already_locked: bool = False,
    read_by: Actor | None = None,
    decisions: list[Decision] | None = None,
) -> tuple[ApprovalRequest, Run | None]:
    """Record one decision; the one that settles the request resumes the run.

    Exactly one outcome: the request row is locked, so of concurrent deciders
    one wins and the others get a 409. An approval counts for the arguments
    it approved, once per person (all service keys together count once); an
    edit is validated against the action's declaration, needs a note, and
    may raise the risk and the approvals needed (approvals.edits); so does a
    change of a plan, `plan` (steps removed, arguments edited: approvals.plans).

    `seen_args` are the arguments the reviewer was shown (the desk's card):
    if another reviewer's edit changed them since, RequestChanged, and
    nothing is recorded.

    In the caller's transaction if there is one, with no savepoint of its
    own: a caller that goes on after a refusal puts one around it. The
    request returned has `decisions_now`: its decisions, this one last, as
    `approvals.selectors.approval_view` shows them. `already_locked`: the caller
    read `approval` and its thread locked (approvals.services.lifecycle.
    locked_pending) in this transaction, with their tenants. `read_by`: the caller answers with the request's
    content (the API's decision): its `approval.read` is recorded with the
    decision's event, in its statement. `decisions`, with `already_locked`:
    the request's decisions, read in this transaction after its lock
    (approvals.selectors.decisions_query), not read again.
    """
    note = (note or "").strip()
    if not approved and not note:
        raise InvalidRequest("a denial needs a note that says why", field="note")
    if args is not None and not approved:
        raise InvalidRequest("edited args go with an approval only", field="args")
    if plan is not None and not approved:
        raise InvalidRequest("a changed plan goes with an approval only", field="plan")
    request = locked_pending(approval, already_locked=already_locked)
    cipher = ThreadCipher.for_thread(request.thread)
    original = payload_of(request, cipher)["args"]
    earlier = decisions_of(request, decisions if already_locked else None)
    current = current_args(original, earlier, cipher)
    if seen_args is not None and jsonable(current) != seen_args:
        raise RequestChanged(seen_args, jsonable(current))
    action = action_of(request.thread, request.action)
    edit = request_edit(request, action, current, args=args, plan=plan)
    if edit is not None and not note:
        raise InvalidRequest(
            "an edit of the arguments needs a note that says why", field="note"
        )
    approved_args = edit if edit is not None else current
    counted = counted_approvals(earlier, approved_args, original)
    if approved and reviewer.counted_as in counted:
        raise _same_reviewer(reviewer)
    edits = request_diff(request, current, edit) if edit is not None else []
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
        {"note": note, "args": edit, "edits": edits}, row=decision_row(decision)
    )
    request.decisions_now = [*earlier, decision]

    approvals = len(counted | {reviewer.counted_as}) if approved else 0
    settled = (not approved) or approvals >= request.required_approvals
    verdict = "approved" if approved else "denied"
    if approved and not settled:
        verdict = f"approved ({approvals} of {request.required_approvals})"
    shown = safe_args(request.thread)
    if edit is not None:
        # The queue finds the request by what it would now execute.
        request.safe_args = safe_args_text(edit, shown)
        request.save(update_fields=["safe_args"])
    edit_text = ""
    if edits:
        edit_text = "; edited " + audit_diff_text(edits, shown, limit=150)
        if risk_rose:
            edit_text += f" (now {request.risk} risk)"
    # The decision's INSERT and, if it settles the request, the request's
    # UPDATE (settled first: the gate opens only for the value stored with
    # it) in the statement of the event; where only Model.save may insert
    # the decision, each written before the event.
    insert = insert_statement(decision)
    if insert is None:
        save_new(decision)
    writes = [insert] if insert is not None else []
    if settled:
        value = resume_value(
            approval=request,
            approved=approved,
            note=note,
            reviewer=reviewer.shown,
            args=approved_args if approved else current,
            edits=request_diff(request, original, approved_args) if approved else [],
        )
        fields = approval_settled(
            approval=request,
            status=request.Status.APPROVED if approved else request.Status.DENIED,
            resume_value=value,
        )
        # Without the insert the settle is not a write of the event's: alone
        # there, one that found no row would record nothing, not fail.
        settle = update_statement(request, fields) if writes else None
        if settle is None:
            save_fields(request, fields)
        else:
            writes.append(settle)
    approval_event(
        approval=request,
        kind=events.APPROVAL_DECIDED,
        actor=reviewer.actor,
        writes=writes,
        read_by=read_by,
        verdict=verdict,
        reviewer=reviewer.shown[:200],
        edit=edit_text[:200],
        args_edited=decision.args_edited,
        risk=request.risk,
        required_approvals=request.required_approvals,
        **({"edited_args": describe(edit, safe_keys=shown)} if edits else {}),
    )
    if insert is not None:
        inserted(decision)
    if not settled:
        return request, None
    run = approval_resume(
        approval=request, value=value, actor=reviewer.actor, thread_locked=True
    )
    return request, run
