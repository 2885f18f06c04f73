"""When approvals are due, and how unanswered ones escalate: the policy.

Approvals owns the concept (`ApprovalPolicy`: due time per risk, the chain of
escalation steps, the time to expiry) and its defaults from settings. Where a
tenant's own values are kept is not its business: the app that stores them
(retention, in its retention policy) registers a source when it starts
(`register_policy_source`), so approvals never looks upwards for them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings

from approvals.models import ApprovalRequest, Risk
from runs.models import Role, Tenant


@dataclass(frozen=True)
class EscalationStep:
    """One hop of the chain: `after` the previous hop (the first after the
    request's due time), notify the members with these roles."""

    level: int  # 1 for the first hop
    name: str
    after: timedelta
    notify: tuple[str, ...]


def default_due_hours(risk: str) -> int:
    hours = settings.GATEHOUSE_APPROVAL_DUE_HOURS
    return int(hours.get(risk, hours[Risk.MEDIUM]))


def default_chain() -> list[dict]:
    """The chain as stored: remind reviewers at the due time, then escalate
    to compliance officers."""
    return [
        {"name": "remind", "after_hours": 0, "notify": [Role.REVIEWER.value]},
        {
            "name": "escalate",
            "after_hours": settings.GATEHOUSE_APPROVAL_ESCALATE_AFTER_HOURS,
            "notify": [Role.COMPLIANCE_OFFICER.value],
        },
    ]


def default_expire_after_hours() -> int:
    return settings.GATEHOUSE_APPROVAL_EXPIRE_AFTER_HOURS


@dataclass(frozen=True)
class ApprovalPolicy:
    due_hours: Mapping[str, int]
    steps: tuple[EscalationStep, ...]
    expire_after: timedelta

    @classmethod
    def from_stored(
        cls, *, due_hours: Mapping[str, int], chain: list[dict], expire_after_hours
    ) -> ApprovalPolicy:
        """From the stored form: hours per risk, the chain as a list of
        {"name", "after_hours", "notify"}, hours to expiry."""
        return cls(
            due_hours=dict(due_hours),
            steps=tuple(
                EscalationStep(
                    level=level,
                    name=step["name"],
                    after=timedelta(hours=step["after_hours"]),
                    notify=tuple(step["notify"]),
                )
                for level, step in enumerate(chain, start=1)
            ),
            expire_after=timedelta(hours=expire_after_hours),
        )

    @classmethod
    def defaults(cls) -> ApprovalPolicy:
        return cls.from_stored(
            due_hours={risk: default_due_hours(risk) for risk in Risk.values},
            chain=default_chain(),
            expire_after_hours=default_expire_after_hours(),
        )

    def due_in(self, risk: str) -> timedelta:
        hours = self.due_hours.get(risk, self.due_hours[Risk.MEDIUM])
        return timedelta(hours=hours)


PolicySource = Callable[[Tenant], ApprovalPolicy]
_source: PolicySource | None = None


def register_policy_source(source: PolicySource) -> None:
    """Where tenants' policies come from (RetentionConfig.ready registers it)."""
    global _source
    _source = source


def policy_for(tenant: Tenant) -> ApprovalPolicy:
    """The tenant's approval policy; the defaults when no source is registered."""
    return _source(tenant) if _source is not None else ApprovalPolicy.defaults()


@dataclass(frozen=True)
class Hop:
    """The next thing to happen to a pending request, and when."""

    action: str  # "escalate" or "expire"
    at: datetime
    step: EscalationStep | None = None  # for "escalate"


def next_hop(approval: ApprovalRequest, policy: ApprovalPolicy) -> Hop:
    """Each hop counts from the previous one as it actually happened
    (`escalated_at`), so a late sweep never shortens the time people had."""
    level = approval.escalation_level
    since = (
        approval.escalated_at if level and approval.escalated_at else approval.due_at
    )
    if level < len(policy.steps):
        step = policy.steps[level]
        return Hop(action="escalate", at=since + step.after, step=step)
    return Hop(action="expire", at=since + policy.expire_after)
