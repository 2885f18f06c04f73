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
from runs.actions import ArgsInvalid, GatedAction


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


def diff_text(edits: list[dict[str, Any]]) -> str:
    """ "amount 30.00 → 900.00; note x → y"."""
    return "; ".join(
        f"{edit['arg']} {value_text(edit['old'])} → {value_text(edit['new'])}"
        for edit in edits
    )


def audit_diff_text(edits: list[dict[str, Any]], safe_keys, limit: int) -> str:
    """The diff for the audit trail: declared-safe values in clear, the others
    as keyed digests (audit.redaction), within `limit` characters."""
    old = describe({edit["arg"]: edit["old"] for edit in edits}, safe_keys)
    new = describe({edit["arg"]: edit["new"] for edit in edits}, safe_keys)
    text = diff_text(
        [{"arg": name, "old": old[name], "new": new[name]} for name in old]
    )
    return text if len(text) <= limit else text[: limit - 1] + "…"
