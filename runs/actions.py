"""What an agent declares about the actions it asks a human to approve.

An agent module lists its gated actions on its factory, beside `safe_args`:

    class RefundArgs(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")
        order_id: str
        amount: Decimal = pydantic.Field(gt=0, le=10_000, decimal_places=2)
        currency: Literal["EUR", "USD"]

    def refund_risk(args: RefundArgs) -> str:
        return "high" if args.amount >= 500 else "low"

    build_graph.actions = [
        GatedAction(
            name="refund_order",        # the interrupt payload's "action"
            node="request_approval",    # the graph node that calls interrupt()
            args=RefundArgs,            # the arguments' schema (pydantic)
            editable={"amount"},        # what a reviewer may change
            risk=refund_risk,           # validated args -> "low"|"medium"|"high"
        ),
    ]

An action that is only ever a step of a plan (a `gate: "plan"` request,
approvals.plans) and never stops for a decision of its own declares no
`node`: its `args`, `editable` and `risk` judge the step and a reviewer's
edit of it.

Gatehouse uses the declaration in two places. `runs.gates` knows from `node`
where the graph stops for a decision, so that no fork or replay writes past
it (an agent that declares nothing gets no fork that writes as a node:
Gatehouse cannot tell where its gates are). `approvals` validates the
arguments of each request, and of each edit a reviewer makes, against `args`:
only `editable` arguments may change, the edit must fit the schema, and the
risk is recomputed with `risk`, so an edit that makes a request riskier needs
the approvals of the riskier request. An action that declares no `args` cannot
be edited.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pydantic

RISKS = ("low", "medium", "high")


def higher_risk(*risks: str) -> str:
    """The highest of `risks` (names in RISKS)."""
    return max(risks, key=RISKS.index)


class ArgsInvalid(ValueError):
    """Arguments that break an action's declaration; `errors` maps each
    argument's name to what is wrong with it."""

    def __init__(self, errors: Mapping[str, str]) -> None:
        self.errors = dict(errors)
        super().__init__(
            "; ".join(f"{name}: {message}" for name, message in self.errors.items())
        )


def _pydantic_errors(exc: pydantic.ValidationError) -> dict[str, str]:
    errors: dict[str, str] = {}
    for error in exc.errors(include_url=False):
        name = ".".join(str(part) for part in error["loc"]) or "args"
        errors.setdefault(name, error["msg"])
    return errors


@dataclass(frozen=True)
class GatedAction:
    """One action an agent asks approval for; see the module docstring."""

    name: str
    # None: an action reviewed only as a step of a plan (approvals.plans),
    # which never stops for a decision of its own.
    node: str | None = None
    args: type[pydantic.BaseModel] | None = None
    editable: frozenset[str] = field(default_factory=frozenset)
    risk: Callable[[Any], str] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "editable", frozenset(self.editable))
        if self.editable and self.args is None:
            raise ValueError(
                f"action {self.name}: editable arguments need an args schema"
            )
        if self.args is not None:
            unknown = sorted(self.editable - set(self.args.model_fields))
            if unknown:
                raise ValueError(
                    f"action {self.name}: editable {', '.join(unknown)} not in "
                    f"{self.args.__name__}"
                )

    def validated(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """The arguments as the schema reads them, in JSON form (a Decimal
        as its string); ArgsInvalid naming each bad argument."""
        if self.args is None:
            return dict(args)
        try:
            model = self.args.model_validate(dict(args))
        except pydantic.ValidationError as exc:
            raise ArgsInvalid(_pydantic_errors(exc)) from None
        return model.model_dump(mode="json")

    def edited(
        self, original: Mapping[str, Any], edit: Mapping[str, Any]
    ) -> dict[str, Any]:
        """An edit of `original`, validated: only editable arguments change."""
        if self.args is None:
            raise ArgsInvalid(
                {
                    "args": f"action {self.name} declares no argument schema, so its "
                    "arguments cannot be edited"
                }
            )
        current = self.validated(original)
        proposed = self.validated(edit)
        frozen = sorted(
            name
            for name in set(current) | set(proposed)
            if name not in self.editable and current.get(name) != proposed.get(name)
        )
        if frozen:
            editable = ", ".join(sorted(self.editable)) or "none"
            raise ArgsInvalid(
                {
                    name: f"{name} cannot be edited (editable: {editable})"
                    for name in frozen
                }
            )
        return proposed

    def risk_of(self, args: Mapping[str, Any]) -> str | None:
        """The declared risk of these (valid) arguments, or None if undeclared."""
        if self.risk is None:
            return None
        model = self.args.model_validate(dict(args)) if self.args else dict(args)
        risk = self.risk(model)
        if risk not in RISKS:
            raise ValueError(
                f"action {self.name}: risk rule returned {risk!r}, not one of "
                f"{', '.join(RISKS)}"
            )
        return risk


def declared_actions(factory: Any) -> dict[str, GatedAction] | None:
    """The factory's actions by name; None when it declares none at all (an
    empty list declares that the agent has no gates)."""
    declared: Iterable[GatedAction] | None = getattr(factory, "actions", None)
    if declared is None:
        return None
    actions: dict[str, GatedAction] = {}
    for action in declared:
        if not isinstance(action, GatedAction):
            raise TypeError(
                f"{factory!r}.actions must hold GatedAction, not {action!r}"
            )
        if action.name in actions:
            raise ValueError(f"action {action.name} declared twice")
        actions[action.name] = action
    return actions
