"""Plan review: a request to approve an agent's whole plan at once.

An agent that asks approval for its plan interrupts with `gate: "plan"` and
the plan as its arguments, `{"steps": [...]}`: the ordered steps, each
`{"action", "args", "reason", "affects", "if_denied", "risk"?}` (api.md's
payload rules, per step). When the request opens, each step is numbered
(`step`, from 1, the agent's order) and its arguments are checked against the
agent's declaration of the step's action (runs.actions.GatedAction), which
also gives the step's risk; the plan's risk is its riskiest step's.

A reviewer approves the plan as it is, denies it, or approves it changed:
steps removed, or a step's arguments edited (all of them, as an action gate's
`args`), `{"remove": [3], "args": {"2": {...}}}`. A change obeys the gate's
rules: each edit is validated against the step action's schema (only its
editable arguments change), it needs a note, and the risk is recomputed:
removing steps cannot raise it, an edit can (approvals.services). Steps keep
their numbers, so the approved plan says which of the agent's steps it keeps,
and the change is shown step by step as old -> new.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rest_framework import exceptions

from approvals.edits import action_of, args_diff, declared_risk, validated_edit
from approvals.models import ApprovalRequest, Gate
from runs.actions import RISKS, ArgsInvalid, GatedAction, higher_risk
from runs.errors import InvalidRequest

# A step's own fields; `step` is Gatehouse's numbering.
STEP_TEXT = ("action", "reason", "affects", "if_denied")
STEP_FIELDS = frozenset({"step", "args", "risk", *STEP_TEXT})
MAX_STEPS = 50


class PlanRejected(ValueError):
    """A plan payload the contract or the agent's declarations refuse."""


class InvalidPlan(exceptions.ValidationError):
    """A reviewer's change of a plan that the gate's rules refuse: 400 with
    `{"plan": {"remove": [...], "args": {"<step>": {"<arg>": [...]}}}}`.
    `errors` maps (the step's number as text, or None for the removals;
    the argument, or None for the whole step) to the message, for forms
    that show each on its field."""

    def __init__(self, errors: Mapping[tuple[str | None, str | None], str]) -> None:
        self.errors = dict(errors)
        detail: dict[str, Any] = {}
        for (step, arg), message in self.errors.items():
            if step is None:
                detail.setdefault("remove", []).append(message)
            elif arg is None:
                detail.setdefault("args", {}).setdefault(step, []).append(message)
            else:
                named = detail.setdefault("args", {}).setdefault(step, {})
                named.setdefault(arg, []).append(message)
        super().__init__({"plan": detail})


def steps_of(plan_args: Mapping[str, Any]) -> list[dict[str, Any]]:
    return list(plan_args.get("steps") or [])


def plan_risk(plan_args: Mapping[str, Any]) -> str:
    """A plan's risk: its riskiest step's."""
    return higher_risk("low", *(step["risk"] for step in steps_of(plan_args)))


def _step_problems(step: Any) -> list[str]:
    if not isinstance(step, dict):
        return ["must be an object"]
    problems = [
        f"lacks {name}"
        for name in STEP_TEXT
        if not isinstance(step.get(name), str) or not step[name].strip()
    ]
    if not isinstance(step.get("args", {}), dict):
        problems.append("args must be an object")
    if "risk" in step and step["risk"] not in RISKS:
        problems.append(f"risk must be one of {', '.join(RISKS)}")
    unknown = sorted(set(step) - STEP_FIELDS)
    if unknown:
        problems.append(f"unknown field(s) {', '.join(unknown)}")
    return problems


def plan_opened(thread, args: Mapping[str, Any]) -> dict[str, Any]:
    """The plan of a `gate: "plan"` payload as its request keeps it: steps
    numbered, each with its risk; PlanRejected naming every problem."""
    steps = args.get("steps")
    if set(args) != {"steps"} or not isinstance(steps, list) or not steps:
        raise PlanRejected(
            'a plan gate\'s args must be {"steps": [...]}, a non-empty list of '
            "steps, each with action, args, reason, affects and if_denied"
        )
    if len(steps) > MAX_STEPS:
        raise PlanRejected(f"a plan has at most {MAX_STEPS} steps, not {len(steps)}")
    problems = []
    opened = []
    for number, step in enumerate(steps, start=1):
        found = _step_problems(step)
        if not found and step.get("step", number) != number:
            found = [f"is numbered {step['step']!r}: steps are numbered from 1"]
        if not found:
            step_args = step.get("args", {})
            try:
                risk = declared_risk(
                    action_of(thread, step["action"]), step_args, step.get("risk")
                )
            except ArgsInvalid as exc:
                found = [f"the arguments of {step['action']} break its schema: {exc}"]
        if found:
            problems.append(f"step {number} " + ", ".join(found))
            continue
        opened.append(
            {
                "step": number,
                **{name: step[name] for name in STEP_TEXT},
                "args": step_args,
                "risk": risk or "medium",
            }
        )
    if problems:
        raise PlanRejected("the plan is invalid: " + "; ".join(problems))
    return {"steps": opened}


def _step_number(key: Any) -> int | None:
    try:
        number = int(str(key))
    except ValueError:
        return None
    return number if str(number) == str(key).strip() else None


def plan_edited(
    thread, current: Mapping[str, Any], change: Mapping[str, Any]
) -> dict[str, Any] | None:
    """The plan `current` with `change` ({"remove": [numbers], "args":
    {"<number>": all the step's arguments}}) applied and validated; None when
    it changes nothing; InvalidPlan naming each problem."""
    steps = {step["step"]: step for step in steps_of(current)}
    shown = ", ".join(str(number) for number in steps)
    errors: dict[tuple[str | None, str | None], str] = {}
    remove = set(change.get("remove") or [])
    unknown = sorted(remove - set(steps))
    if unknown:
        errors[(None, None)] = (
            f"step(s) {', '.join(map(str, unknown))} not in the plan (its steps: "
            f"{shown})"
        )
    edited: dict[int, dict[str, Any]] = {}
    for key, args in (change.get("args") or {}).items():
        number = _step_number(key)
        if number not in steps:
            errors[(str(key), None)] = (
                f"step {key} is not in the plan (its steps: {shown})"
            )
            continue
        if number in remove:
            errors[(str(key), None)] = f"step {number} is removed: it has no arguments"
            continue
        step = steps[number]
        action = action_of(thread, step["action"])
        if action is None or action.args is None:
            errors[(str(key), None)] = (
                f"{step['action']} declares no argument schema, so its arguments "
                "cannot be edited"
            )
            continue
        try:
            proposed = action.edited(step["args"], args)
            if proposed != action.validated(step["args"]):
                # The step's own gate judges the arguments it runs with by the
                # same rule (the request's risk, though, never falls).
                risk = action.risk_of(proposed) or step["risk"]
                edited[number] = {**step, "args": proposed, "risk": risk}
        except ArgsInvalid as exc:
            for arg, message in exc.errors.items():
                errors[(str(key), arg)] = message
    if not errors and remove >= set(steps):
        errors[(None, None)] = (
            "removing every step leaves nothing to approve: deny the plan instead"
        )
    if errors:
        raise InvalidPlan(errors)
    if not remove and not edited:
        return None
    return {
        "steps": [
            edited.get(number, step)
            for number, step in steps.items()
            if number not in remove
        ]
    }


def plan_diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[dict[str, Any]]:
    """How plan `new` differs from `old`, step by step, in step order:
    `{"step", "action", "removed": true, "arg": None, "old": args, "new": None}`
    for a step removed, `{"step", "action", "arg", "old", "new"}` for each
    argument changed."""
    kept = {step["step"]: step for step in steps_of(new)}
    diff = []
    for step in steps_of(old):
        after = kept.get(step["step"])
        base = {"step": step["step"], "action": step["action"]}
        if after is None:
            diff.append(
                {**base, "removed": True, "arg": None, "old": step["args"], "new": None}
            )
            continue
        diff.extend({**base, **edit} for edit in args_diff(step["args"], after["args"]))
    return diff


# --- A request's arguments, whichever its gate -----------------------------------


def is_plan(request: ApprovalRequest) -> bool:
    return request.gate == Gate.PLAN


def request_edit(
    request: ApprovalRequest,
    action: GatedAction | None,
    current: dict[str, Any],
    *,
    args: dict[str, Any] | None,
    plan: Mapping[str, Any] | None,
) -> dict[str, Any] | None:
    """What a decision approves instead of `current`, validated: an action's
    edited `args`, or a plan's change; None when nothing changes."""
    if is_plan(request):
        if args is not None:
            raise InvalidRequest(
                "this request asks approval for a plan: remove its steps or edit "
                "their arguments with plan, not args",
                field="args",
            )
        return plan_edited(request.thread, current, plan) if plan else None
    if plan is not None:
        raise InvalidRequest(
            "this request asks approval for one action, not a plan: edit its "
            "arguments with args",
            field="plan",
        )
    return validated_edit(action, current, args) if args is not None else None


def request_diff(
    request: ApprovalRequest, old: dict[str, Any], new: dict[str, Any]
) -> list[dict[str, Any]]:
    """How `new` differs from `old`, as every surface shows it (old -> new)."""
    return plan_diff(old, new) if is_plan(request) else args_diff(old, new)


def request_risk(
    request: ApprovalRequest, action: GatedAction | None, args: dict[str, Any]
) -> str | None:
    """The risk the declarations give these arguments; None if undeclared."""
    if is_plan(request):
        return plan_risk(args)
    return action.risk_of(args) if action is not None else None
