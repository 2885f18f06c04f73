"""The reviewer's desk, as shown: the request card, the queue's columns, and
the cards reviewers decided on. Formatting and reads only; what the desk
changes is approvals.services.desk.

A card is a mapping of display values (strings, numbers, bools, lists and
dicts of those), so its hash is stable and it can be stored and shown again
exactly as it was.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
from collections.abc import Iterable
from typing import Any

from django.utils import timezone

from approvals.content import card_row, decision_detail, payload_of, snapshot_row
from approvals.desk_models import Assignment, DecisionSnapshot, RequestOpening
from approvals.edits import action_of, diff_text, edit_text, value_text
from approvals.models import ApprovalRequest, Decision
from approvals.plans import is_plan, request_diff, steps_of
from approvals.reviewers import approves, counted_approvals, current_args
from runs.crypto import CryptoError, ThreadCipher, ThreadDeleted
from runs.errors import VersionSkew
from runs.selectors import jsonable
from runs.services import thread_snapshot
from runs.timezones import moment_text

logger = logging.getLogger(__name__)

# How much of the thread's context a card shows.
CONTEXT_MESSAGES = 6
CONTEXT_TEXT_CHARS = 2000
THREAD_DECISIONS = 10
SUMMARY_CHARS = 90


# --- Formatting ------------------------------------------------------------------


def duration_text(delta: datetime.timedelta) -> str:
    """A duration as a person reads it: "2 d 3 h", "3 h 4 min", "40 s"."""
    seconds = int(abs(delta.total_seconds()))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes} min"
    if minutes:
        return f"{minutes} min"
    return f"{seconds} s"


def time_text(moment: datetime.datetime | None) -> str:
    """A time as the admin writes it: in the reader's zone, to the second."""
    return moment_text(moment)


def readable_text(value: Any) -> str:
    """A value as a person reads it, not as JSON: a mapping one "key: value"
    line per key (nested ones as `key=value, …`), a list one line per item.
    Text that holds a JSON object or list (a message an agent built with
    json.dumps) is read the same way; other text stays as it is."""
    if isinstance(value, str):
        stripped = value.strip()
        if not stripped.startswith(("{", "[")):
            return value
        try:
            value = json.loads(stripped)
        except ValueError:
            return value
    if isinstance(value, dict):
        return "\n".join(f"{key}: {_inline(item)}" for key, item in value.items())
    if isinstance(value, list):
        return "\n".join(f"- {_inline(item)}" for item in value)
    return value_text(value)


def _inline(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{key}={_inline(item)}" for key, item in value.items())
    if isinstance(value, list):
        return ", ".join(_inline(item) for item in value)
    return value_text(value)


def args_summary(args: dict[str, Any], limit: int = SUMMARY_CHARS) -> str:
    """One line: `order_id=A-1001, amount=40.00, currency=EUR`."""
    text = ", ".join(f"{key}={value_text(value)}" for key, value in args.items())
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def request_summary(
    approval: ApprovalRequest, payload: dict[str, Any], limit: int = SUMMARY_CHARS
) -> str:
    """One line: its arguments, or a plan's steps in order: `3 steps:
    reserve_stock, charge_card, notify_customer`."""
    if not is_plan(approval):
        return args_summary(payload["args"], limit)
    steps = steps_of(payload["args"])
    text = f"{len(steps)} steps: " + ", ".join(step["action"] for step in steps)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def plan_card(
    thread, original: dict[str, Any], current: dict[str, Any], edits: list
) -> dict[str, Any]:
    """A plan as the card numbers it: every step the agent proposed, in its
    order, with its arguments as an approval approves them now, the edits
    (old -> new), whether a reviewer removed it, and what may be edited;
    and the changes, one line each."""
    kept = {step["step"]: step for step in steps_of(current)}
    shown = []
    for step in steps_of(original):
        now = kept.get(step["step"], step)
        changed = {
            edit["arg"]: edit
            for edit in edits
            if edit["step"] == step["step"] and not edit.get("removed")
        }
        action = action_of(thread, step["action"])
        shown.append(
            {
                "step": step["step"],
                "action": step["action"],
                "reason": step["reason"],
                "affects": step["affects"],
                "if_denied": step["if_denied"],
                "risk": now["risk"],
                "removed": step["step"] not in kept,
                "args": [
                    [
                        key,
                        value_text(value),
                        value_text(changed[key]["old"]) if key in changed else None,
                    ]
                    for key, value in now["args"].items()
                ],
                "editable": sorted(action.editable) if action and action.args else [],
            }
        )
    return {"steps": shown, "changes": [edit_text(edit) for edit in edits]}


# --- The queue -------------------------------------------------------------------


def attach_payloads(rows: Iterable[ApprovalRequest]) -> None:
    """Decrypt the payload of each row, in Python, with no query per row. The
    page that shows them records the read (services.approval_payloads_read).

    The rows must come with their thread (select_related): the thread row
    carries its wrapped key, and unwrapped keys are cached per process. Sets
    `desk_payload` (a dict) or `desk_unreadable` (why not) on each row.
    """
    for row in rows:
        row.desk_payload = None
        row.desk_unreadable = ""
        try:
            row.desk_payload = payload_of(row, ThreadCipher.for_thread(row.thread))
        except ThreadDeleted:
            row.desk_unreadable = "content deleted"
        except CryptoError as exc:
            # Shown, never papered over: a request that cannot be read must be
            # looked into, not approved.
            logger.error("approval %s payload unreadable: %s", row.pk, exc)
            row.desk_unreadable = f"unreadable ({type(exc).__name__})"


# --- The card --------------------------------------------------------------------


def card_hash(card: dict[str, Any]) -> str:
    canonical = json.dumps(
        card, sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def _message_entry(message: Any) -> dict[str, Any]:
    if not isinstance(message, dict):
        return {"role": "message", "text": readable_text(message)[:CONTEXT_TEXT_CHARS]}
    text = readable_text(message.get("content"))
    calls = [
        f"{call.get('name')}({args_summary(call.get('args') or {}, 200)})"
        for call in message.get("tool_calls") or []
        if isinstance(call, dict)
    ]
    return {
        "role": str(message.get("type") or message.get("role") or "message"),
        "text": text[:CONTEXT_TEXT_CHARS],
        "tool_calls": calls,
    }


def _checkpoint_time(value: Any) -> str:
    """LangGraph gives a checkpoint's time as ISO 8601 text."""
    if isinstance(value, str) and value:
        try:
            value = datetime.datetime.fromisoformat(value)
        except ValueError:
            return value
    return time_text(value) if isinstance(value, datetime.datetime) else ""


def context_of(snapshot, shown: list[Any] = ()) -> dict[str, Any]:
    """The thread's recent context from a state snapshot: the last messages
    and the plan; other state only when it has neither. Entries of the plan
    equal to a value in `shown` (what the card shows already: the action, its
    arguments, the reason) are left out rather than said twice."""
    values = jsonable(snapshot.values or {})
    metadata = snapshot.metadata or {}
    context: dict[str, Any] = {
        "checkpoint_id": snapshot.config["configurable"]["checkpoint_id"],
        "step": metadata.get("step"),
        "created_at": _checkpoint_time(snapshot.created_at),
        "messages": [],
        "plan": None,
        "other": None,
    }
    messages = values.get("messages")
    if isinstance(messages, list):
        context["messages"] = [
            _message_entry(message) for message in messages[-CONTEXT_MESSAGES:]
        ]
        context["earlier_messages"] = max(len(messages) - CONTEXT_MESSAGES, 0)
    plan = values.get("plan")
    if isinstance(plan, dict):
        plan = {key: value for key, value in plan.items() if value not in shown}
    if plan:
        context["plan"] = readable_text(plan)
    if not context["messages"] and context["plan"] is None:
        context["other"] = readable_text(values)[:CONTEXT_TEXT_CHARS]
    return context


def _thread_context(approval: ApprovalRequest, shown: list[Any]) -> dict[str, Any]:
    # Not audited on its own: the card's read (approval.read, "card") covers it.
    try:
        snapshot = thread_snapshot(thread=approval.thread)
    except ThreadDeleted:
        return {"unavailable": "the thread was deleted; its content is gone"}
    except VersionSkew as exc:
        return {"unavailable": str(exc.detail)}
    if snapshot is None:
        return {"unavailable": "the thread has no checkpoint yet"}
    return context_of(snapshot, shown)


def _decision_entry(decision: Decision, cipher: ThreadCipher) -> dict[str, Any]:
    detail = decision_detail(decision, cipher)
    return {
        "reviewer": decision.reviewer_shown,
        "principal": decision.principal,
        "approved": decision.approved,
        "note": detail.get("note", ""),
        "edits": diff_text(jsonable(detail.get("edits") or [])),
        "at": time_text(decision.created_at),
    }


def card_fields(
    *, approval: ApprovalRequest, user, now: datetime.datetime | None = None
) -> dict[str, Any]:
    """The card of a request as it is now, for `user`. Not audited here: the
    page that shows it records one `approval.read` ("card") for the request's
    payload, decisions and the thread's context together.

    Every value is a display string, number, bool or list/dict of those, so
    that the card's hash is stable and the card can be stored and shown again
    exactly as it was.
    """
    now = now or timezone.now()
    thread = approval.thread
    cipher = ThreadCipher.for_thread(thread)
    payload = payload_of(approval, cipher)
    decisions = list(approval.decisions.all())
    args = current_args(payload["args"], decisions, cipher)
    edits = jsonable(request_diff(approval, payload["args"], args))
    counted = counted_approvals(decisions, args, payload["args"])
    here = [
        {**_decision_entry(d, cipher), "counts": approves(d, args, payload["args"])}
        for d in decisions
    ]
    action = action_of(thread, approval.action)
    earlier = (
        Decision.objects.filter(request__thread=thread)
        .exclude(request=approval)
        .select_related("request")
        .order_by("-created_at")[:THREAD_DECISIONS]
    )
    thread_decisions = [
        {**_decision_entry(d, cipher), "action": d.request.action} for d in earlier
    ]
    assignment = (
        Assignment.objects.filter(request=approval).select_related("assignee").first()
    )
    due_in = approval.due_at - now
    return {
        "approval_id": str(approval.pk),
        "tenant": approval.tenant.slug,
        "thread_id": thread.thread_id,
        "run_id": str(approval.run_id),
        "agent": f"{thread.agent_name}@{thread.agent_version}",
        "status": approval.status,
        "action": payload["action"],
        # What an approval approves now; "edits" says how it differs from
        # what the agent asked (old -> new).
        "args": jsonable(args),
        "edits": [
            {
                "arg": edit["arg"],
                "old": value_text(edit["old"]),
                "new": value_text(edit["new"]),
            }
            for edit in edits
        ],
        "editable": (
            sorted(action.editable)
            if action and action.args and not is_plan(approval)
            else []
        ),
        # A plan gate's steps, numbered (approvals.plans); None otherwise.
        "plan": (
            plan_card(thread, jsonable(payload["args"]), args, edits)
            if is_plan(approval)
            else None
        ),
        "reason": payload["reason"],
        "affects": payload["affects"],
        "if_denied": payload["if_denied"],
        "risk": approval.risk,
        "gate": approval.gate,
        "required_approvals": approval.required_approvals,
        "approvals_so_far": len(counted),
        "approved_by": sorted(counted),
        "decisions": here,
        "created_at": time_text(approval.created_at),
        "waited": duration_text(now - approval.created_at),
        "due_at": time_text(approval.due_at),
        "escalates": (
            f"in {duration_text(due_in)}"
            if due_in.total_seconds() >= 0
            else f"overdue by {duration_text(due_in)}"
        ),
        "escalation_level": approval.escalation_level,
        "assigned_to": assignment.assignee.get_username() if assignment else "",
        "context": _thread_context(
            approval,
            shown=[payload["action"], jsonable(payload["args"]), payload["reason"]],
        ),
        "thread_decisions": thread_decisions,
        "rendered_at": time_text(now),
    }


def _verified(card: dict[str, Any], expected_hash: str, what: str) -> dict[str, Any]:
    if card_hash(card) != expected_hash:
        raise CryptoError(f"{what} does not match its content hash")
    return card


def opening_card(opening: RequestOpening, cipher: ThreadCipher) -> dict[str, Any]:
    card = cipher.decrypt_value(opening.card, row=card_row(opening))
    return _verified(card, opening.content_hash, f"card of opening {opening.pk}")


def snapshot_card(snapshot: DecisionSnapshot, cipher: ThreadCipher) -> dict[str, Any]:
    card = cipher.decrypt_value(snapshot.card, row=snapshot_row(snapshot))
    return _verified(card, snapshot.content_hash, f"snapshot {snapshot.pk}")


def decisions_with_cards(approval: ApprovalRequest) -> list[dict[str, Any]]:
    """The request's decisions, each with the card its reviewer decided on
    (None for decisions taken through the API)."""
    decisions = list(approval.decisions.select_related("snapshot"))
    if not decisions:
        return []
    cipher = ThreadCipher.for_thread(approval.thread)
    entries = []
    for decision in decisions:
        entry = _decision_entry(decision, cipher)
        snapshot = getattr(decision, "snapshot", None)
        entry["snapshot"] = (
            {
                "content_hash": snapshot.content_hash,
                "rendered_at": time_text(snapshot.rendered_at),
                "opened_for": duration_text(
                    decision.created_at - snapshot.first_opened_at
                ),
                "card": snapshot_card(snapshot, cipher),
            }
            if snapshot is not None
            else None
        )
        entries.append(entry)
    return entries
