"""The interrupt payload contract (api.md): what a reviewer needs to judge."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from approvals.models import Gate, Risk

REQUIRED_TEXT = ("action", "reason", "affects", "if_denied")


class InvalidPayload(ValueError):
    pass


@dataclass(frozen=True)
class ApprovalPayload:
    action: str
    args: dict[str, Any]
    reason: str
    affects: str
    if_denied: str
    risk: str
    gate: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "args": self.args,
            "reason": self.reason,
            "affects": self.affects,
            "if_denied": self.if_denied,
        }


def parse(value: Any) -> ApprovalPayload:
    """Validate an interrupt's value; InvalidPayload names every problem."""
    if not isinstance(value, dict):
        raise InvalidPayload(
            "the interrupt payload must be an object with action, reason, affects "
            f"and if_denied; got {type(value).__name__}"
        )
    missing = [
        name
        for name in REQUIRED_TEXT
        if not isinstance(value.get(name), str) or not value[name].strip()
    ]
    if missing:
        raise InvalidPayload(
            "the interrupt payload lacks "
            + ", ".join(missing)
            + ": a reviewer cannot judge a request without them"
        )
    args = value.get("args", {})
    if not isinstance(args, dict):
        raise InvalidPayload("the interrupt payload's args must be an object")
    risk = value.get("risk", Risk.MEDIUM)
    gate = value.get("gate", Gate.ACTION)
    problems = []
    if risk not in Risk.values:
        problems.append(f"risk must be one of {', '.join(Risk.values)}")
    if gate not in Gate.values:
        problems.append(f"gate must be one of {', '.join(Gate.values)}")
    if len(value["action"]) > 100:
        problems.append("action must be at most 100 characters")
    if problems:
        raise InvalidPayload("the interrupt payload is invalid: " + "; ".join(problems))
    return ApprovalPayload(
        action=value["action"].strip(),
        args=args,
        reason=value["reason"],
        affects=value["affects"],
        if_denied=value["if_denied"],
        risk=risk,
        gate=gate,
    )
