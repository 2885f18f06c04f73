"""Edits of a request's arguments: what the arguments are now, what changed.

A reviewer may approve an edited action (a smaller refund, say) within what
the agent declares (runs.actions.GatedAction): the edit is validated against
the action's schema, only editable arguments change, and the risk is
recomputed from the edited arguments (approvals.services). The edit is shown
as old -> new everywhere: the card, the decision, the resume value, the
snapshot and the audit summary, where values go through
`audit.redaction.describe()` first (only declared-safe arguments in clear).
"""

from __future__ import annotations

import json
from typing import Any

from rest_framework import exceptions

from audit.redaction import describe
from runs import registry
from runs.actions import ArgsInvalid, GatedAction, higher_risk


class InvalidArgs(exceptions.ValidationError):
    """An edit the action's declaration refuses: 400 naming each argument
    (`{"args": {"amount": [...]}}`), or the whole edit (`{"args": [...]}`)."""

    def __init__(self, errors: dict[str, str]) -> None:
        self.errors = dict(errors)
        named = {name: [message] for name, message in errors.items() if name}
        super().__init__({"args": named or [errors.get("", "invalid arguments")]})


def action_of(thread, name: str) -> GatedAction | None:
    """The thread's agent's declaration of an action, if any."""
    try:
        spec = registry.get(thread.agent_name, thread.agent_version)
    except registry.UnknownAgent:
        return None
    return spec.action(name)


def declared_risk(
    action: GatedAction | None, args: dict[str, Any], stated: str | None
) -> str | None:
    """An action's risk for these arguments: its declared rule, never below
    the risk the agent stated; the stated risk when nothing is declared.
    ArgsInvalid when the arguments break the declared schema."""
    if action is None:
        return stated
    declared = action.risk_of(action.validated(args))
    if declared is None:
        return stated
    return higher_risk(stated, declared) if stated else declared


def validated_edit(
    action: GatedAction | None, current: dict[str, Any], edit: dict[str, Any]
) -> dict[str, Any] | None:
    """The edited arguments, validated; None when the edit changes nothing."""
    if action is None or action.args is None:
        raise InvalidArgs(
            {"": "this action declares no argument schema, so it cannot be edited"}
        )
    try:
        proposed = action.edited(current, edit)
        unchanged = proposed == action.validated(current)
    except ArgsInvalid as exc:
        raise InvalidArgs(exc.errors) from None
    return None if unchanged else proposed


def args_diff(old: dict[str, Any], new: dict[str, Any]) -> list[dict[str, Any]]:
    """[{"arg", "old", "new"}] for each argument whose value changed."""
    return [
        {"arg": name, "old": old.get(name), "new": new.get(name)}
        for name in [*old, *(key for key in new if key not in old)]
        if old.get(name) != new.get(name)
    ]


def value_text(value: Any) -> str:
    """An argument's value as shown: strings as they are, the rest as JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def edit_text(edit: dict[str, Any]) -> str:
    """One change as shown: "amount 30.00 → 900.00"; in a plan (approvals.
    plans) "step 2 charge_card amount 50.00 → 40.00", "step 3 book_courier
    removed"."""
    where = f"step {edit['step']} {edit['action']} " if "step" in edit else ""
    if edit.get("removed"):
        return f"{where}removed"
    return f"{where}{edit['arg']} {value_text(edit['old'])} → {value_text(edit['new'])}"


def diff_text(edits: list[dict[str, Any]]) -> str:
    """ "amount 30.00 → 900.00; note x → y"."""
    return "; ".join(edit_text(edit) for edit in edits)


def audit_diff_text(edits: list[dict[str, Any]], safe_keys, limit: int) -> str:
    """The diff for the audit trail: declared-safe values in clear, the others
    as keyed digests (audit.redaction), within `limit` characters."""
    described = []
    for edit in edits:
        if edit.get("removed"):
            described.append(edit)
            continue
        (old,) = describe({edit["arg"]: edit["old"]}, safe_keys).values()
        (new,) = describe({edit["arg"]: edit["new"]}, safe_keys).values()
        described.append({**edit, "old": old, "new": new})
    text = diff_text(described)
    return text if len(text) <= limit else text[: limit - 1] + "…"
