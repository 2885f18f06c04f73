"""The caller of an API request (Principal): its tenant and its scopes, from
its key or its membership (the role rules are runs.permissions).

A service key carries scopes directly. A person acts through a membership,
whose role grants scopes; some roles grant a scope for reading only. A
personal key acts as its owner: its scopes, cut down to what the owner's role
grants now.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from runs.models import ApiKey, Membership, Tenant
from runs.permissions import ROLE_SCOPES


@dataclass(frozen=True)
class Principal:
    """The caller of one request, bound to exactly one tenant."""

    tenant: Tenant
    write_scopes: frozenset[str]
    read_scopes: frozenset[str]
    api_key: ApiKey | None = None
    membership: Membership | None = None
    label: str = field(default="")

    @classmethod
    def for_api_key(cls, api_key: ApiKey) -> Principal:
        """The principal of an authenticated key; a personal key's owner must
        still be a member (ApiKeyAuthentication refuses it otherwise)."""
        scopes = frozenset(api_key.scopes)
        membership = api_key.owner_membership
        if api_key.is_personal:
            if membership is None:
                raise ValueError(f"personal key {api_key.prefix} has no membership")
            write, read_only = ROLE_SCOPES[membership.role]
            return cls(
                tenant=api_key.tenant,
                write_scopes=scopes & write,
                read_scopes=scopes & (write | read_only),
                api_key=api_key,
                membership=membership,
                label=f"{membership.user.get_username()} (key {api_key.prefix})",
            )
        return cls(
            tenant=api_key.tenant,
            write_scopes=scopes,
            read_scopes=scopes,
            api_key=api_key,
            label=f"key {api_key.prefix}",
        )

    @classmethod
    def for_membership(cls, membership: Membership) -> Principal:
        write, read_only = ROLE_SCOPES[membership.role]
        return cls(
            tenant=membership.tenant,
            write_scopes=write,
            read_scopes=write | read_only,
            membership=membership,
            label=membership.user.get_username(),
        )

    @property
    def role(self) -> str | None:
        return self.membership.role if self.membership else None

    @property
    def user(self):
        """The person acting (a session, or a personal key's owner), or None
        for a service key."""
        return self.membership.user if self.membership else None

    def can(self, scope: str, *, write: bool) -> bool:
        return scope in (self.write_scopes if write else self.read_scopes)
