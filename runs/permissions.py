"""Who may do what: one map from role to scopes and capabilities, and `can()`.

Scopes are what API keys carry and roles grant (runs, approvals, audit,
time_travel); a role grants some only for reading. Capabilities name the
acts that a scope alone does not settle: reading a thread's decrypted state,
deciding an approval, managing members, issuing keys. The API
(runs.api.permissions) and the admin (runs.admin_scoping, the apps' admin
classes) both ask here.

Tenant admins manage the tenant (members, keys, policies) and nothing else:
they read no decrypted content and decide nothing, change no membership of
their own, and issue no key with a scope their role does not grant.
"""

from __future__ import annotations

from runs.models import Role, Scope

# role -> (scopes with writes, scopes read-only)
ROLE_SCOPES: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    Role.REVIEWER: (frozenset({Scope.APPROVALS}), frozenset({Scope.RUNS})),
    Role.COMPLIANCE_OFFICER: (
        frozenset({Scope.APPROVALS}),
        frozenset({Scope.RUNS, Scope.AUDIT}),
    ),
    Role.AUDITOR: (frozenset(), frozenset({Scope.RUNS, Scope.APPROVALS, Scope.AUDIT})),
    # Manages keys, members and policies; deciding is for reviewers.
    Role.TENANT_ADMIN: (frozenset({Scope.RUNS}), frozenset({Scope.AUDIT})),
}

READ_STATE = "threads.read_state"
DECIDE = "approvals.decide"
VIEW_APPROVALS = "approvals.view"  # the desk's queue and cards
MANAGE_QUEUE = "approvals.manage_queue"  # reassign, escalate by hand
REVIEW_STATS = "approvals.review_stats"  # the dashboard's reviewer figures
MANAGE_MEMBERS = "members.manage"
ISSUE_KEYS = "keys.issue"

ROLE_CAPABILITIES: dict[str, frozenset[str]] = {
    Role.REVIEWER: frozenset({READ_STATE, DECIDE, VIEW_APPROVALS}),
    Role.COMPLIANCE_OFFICER: frozenset(
        {READ_STATE, DECIDE, VIEW_APPROVALS, MANAGE_QUEUE, REVIEW_STATS}
    ),
    Role.AUDITOR: frozenset({READ_STATE, VIEW_APPROVALS, REVIEW_STATS}),
    Role.TENANT_ADMIN: frozenset({MANAGE_MEMBERS, ISSUE_KEYS}),
}
# What a service key may do beyond its scopes' reads and writes, by scope.
SCOPE_CAPABILITIES: dict[str, frozenset[str]] = {
    Scope.RUNS: frozenset({READ_STATE}),
    Scope.APPROVALS: frozenset({DECIDE}),
}


def role_scopes(role: str) -> frozenset[str]:
    """Every scope a role grants, for reading at least."""
    write, read_only = ROLE_SCOPES[role]
    return write | read_only


def roles_with(capability: str) -> frozenset[str]:
    """The roles that grant `capability`."""
    return frozenset(
        role
        for role, capabilities in ROLE_CAPABILITIES.items()
        if capability in capabilities
    )


def can(principal, capability: str) -> bool:
    """Whether the caller of an API request may do `capability`: a person by
    their role; a service key by its scopes; a personal key by both."""
    by_scopes = frozenset().union(
        *(SCOPE_CAPABILITIES.get(scope, ()) for scope in principal.read_scopes)
    )
    if principal.membership is None:
        return capability in by_scopes
    by_role = ROLE_CAPABILITIES[principal.membership.role]
    if principal.api_key is not None:
        return capability in by_role and capability in by_scopes
    return capability in by_role
