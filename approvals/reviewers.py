"""Who decides, and how approvals count.

A reviewer is an authenticated principal, never a typed name. An approval
counts for the arguments it approved, once per person; every service key
together counts as one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from approvals.content import decision_detail
from approvals.models import Decision, Risk
from audit.redaction import digest
from audit.services import Actor
from runs.crypto import ThreadCipher

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
