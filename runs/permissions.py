"""Who may do what: one map from role to scopes and capabilities, and `can()`.

Scopes are what API keys carry and roles grant (runs, approvals, audit,
time_travel); a role grants some only for reading. Capabilities name the
acts that a scope alone does not settle (reading a thread's decrypted state,
deciding an approval, asking for a deletion) and every page of the admin.
The API asks `can(principal, capability)` (runs.api.permissions); the admin
asks `runs.admin_scoping.user_can(user, capability, tenant_id)`, which reads
the same map: no view or admin class names a role.

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

# Capabilities, by what they let one do. A role's admin pages and API
# endpoints ask for one of these; none asks for a role.
VIEW_TENANT = "tenant.view"  # the tenant's page; one's own personal keys
MANAGE_TENANT = "tenant.manage"  # rename the tenant
VIEW_MEMBERS = "members.view"
MANAGE_MEMBERS = "members.manage"
VIEW_KEYS = "keys.view"
ISSUE_KEYS = "keys.issue"  # service keys (and revoking any key of the tenant)
LIFT_LOCKOUTS = "logins.lift"  # admin login lockouts of the tenant's people
VIEW_THREADS = "threads.view"  # threads and runs, structure only
READ_STATE = "threads.read_state"  # decrypted state and interrupt values (audited)
RECOVER_RUNS = "runs.recover"  # retry or close a thread whose run failed
VIEW_APPROVALS = "approvals.view"  # the desk's queue, cards and dashboard
DECIDE = "approvals.decide"
MANAGE_QUEUE = "approvals.manage_queue"  # reassign, escalate by hand
REVIEW_STATS = "approvals.review_stats"  # the dashboard's reviewer figures
READ_AUDIT = "audit.read"  # the trail in the admin
VIEW_POLICY = "retention.view_policy"
MANAGE_POLICY = "retention.manage_policy"
VIEW_HOLDS = "legal_holds.view"
MANAGE_HOLDS = "legal_holds.manage"  # place and lift legal holds
READ_DELETIONS = "deletion.read"
REQUEST_DELETION = "deletion.request"
VIEW_WEBHOOKS = "webhooks.view"
MANAGE_WEBHOOKS = "webhooks.manage"

_EVERY_ROLE = frozenset({VIEW_TENANT, VIEW_THREADS})
ROLE_CAPABILITIES: dict[str, frozenset[str]] = {
    Role.REVIEWER: _EVERY_ROLE | {READ_STATE, VIEW_APPROVALS, DECIDE},
    # Compliance decides what a reviewer cannot: the queue, failed runs,
    # holds, deletion.
    Role.COMPLIANCE_OFFICER: _EVERY_ROLE
    | {
        READ_STATE,
        VIEW_APPROVALS,
        DECIDE,
        MANAGE_QUEUE,
        REVIEW_STATS,
        RECOVER_RUNS,
        LIFT_LOCKOUTS,
        VIEW_MEMBERS,
        VIEW_KEYS,
        READ_AUDIT,
        VIEW_POLICY,
        MANAGE_HOLDS,
        READ_DELETIONS,
        REQUEST_DELETION,
        VIEW_WEBHOOKS,
    },
    Role.AUDITOR: _EVERY_ROLE
    | {
        READ_STATE,
        VIEW_APPROVALS,
        REVIEW_STATS,
        VIEW_MEMBERS,
        VIEW_KEYS,
        READ_AUDIT,
        VIEW_POLICY,
        VIEW_HOLDS,
        READ_DELETIONS,
        VIEW_WEBHOOKS,
    },
    # Manages the tenant; reads no decrypted content and decides nothing.
    Role.TENANT_ADMIN: _EVERY_ROLE
    | {
        MANAGE_TENANT,
        MANAGE_MEMBERS,
        ISSUE_KEYS,
        READ_AUDIT,
        MANAGE_POLICY,
        VIEW_HOLDS,
        READ_DELETIONS,
        REQUEST_DELETION,
        MANAGE_WEBHOOKS,
    },
}
# What a service key may do beyond its scopes' reads and writes, by scope.
SCOPE_CAPABILITIES: dict[str, frozenset[str]] = {
    Scope.RUNS: frozenset({READ_STATE, READ_DELETIONS, REQUEST_DELETION}),
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


def scope_capabilities(scopes) -> frozenset[str]:
    return frozenset().union(*(SCOPE_CAPABILITIES.get(scope, ()) for scope in scopes))


def withheld_from_key(roles, scopes) -> list[str]:
    """What a service key with `scopes` would be able to do that its issuer,
    of `roles` in the key's tenant, may not: withheld from the key, so no one
    issues a key that does more than they can (a tenant admin's `runs` key
    reads no state)."""
    held = frozenset().union(*(ROLE_CAPABILITIES[role] for role in roles))
    return sorted(scope_capabilities(scopes) - held)


def can(principal, capability: str) -> bool:
    """Whether the caller of an API request may do `capability`: a person by
    their role; a service key by its scopes, less what its issuer lacked; a
    personal key by both."""
    by_scopes = scope_capabilities(principal.read_scopes)
    if principal.membership is None:
        withheld = principal.api_key.withheld if principal.api_key else ()
        return capability in by_scopes and capability not in withheld
    by_role = ROLE_CAPABILITIES[principal.membership.role]
    if principal.api_key is not None:
        return capability in by_role and capability in by_scopes
    return capability in by_role
