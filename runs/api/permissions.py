"""Binds each API request to one tenant and checks the view's scope.

Views declare `required_scope` ("runs", "approvals" or "audit"), and some a
`required_capability` as well (runs.permissions: reading decrypted state,
deciding); this default
permission class resolves the caller's tenant (request.principal) and refuses a
missing scope with 403. A view without a declared scope is refused, so a new
endpoint cannot be left open by forgetting one.
"""

from __future__ import annotations

from rest_framework import exceptions, permissions

from runs.access import Principal
from runs.models import ApiKey, Membership
from runs.permissions import can

TENANT_HEADER = "X-Gatehouse-Tenant"


def resolve_principal(request) -> Principal:
    if isinstance(request.auth, ApiKey):
        return Principal.for_api_key(request.auth)
    user = request.user
    if not (user and user.is_authenticated):
        raise exceptions.NotAuthenticated()
    memberships = Membership.objects.select_related("tenant", "user").filter(user=user)
    wanted = request.headers.get(TENANT_HEADER)
    if wanted:
        memberships = memberships.filter(tenant__slug=wanted)
    found = list(memberships[:2])
    if not found:
        raise exceptions.PermissionDenied("You are not a member of that tenant.")
    if len(found) > 1:
        raise exceptions.PermissionDenied(
            f"You are a member of several tenants: name one in the {TENANT_HEADER} header."
        )
    return Principal.for_membership(found[0])


class TenantScopePermission(permissions.BasePermission):
    def writes(self, request, view) -> bool:
        """Whether the request needs the scope's write right."""
        return request.method not in permissions.SAFE_METHODS

    def has_permission(self, request, view) -> bool:
        if getattr(view, "public", False):
            return True
        scope = getattr(view, "required_scope", None)
        if scope is None:
            raise exceptions.PermissionDenied("This endpoint declares no scope.")
        principal = resolve_principal(request)
        request.principal = principal
        write = self.writes(request, view)
        if not principal.can(scope, write=write):
            what = "write" if write else "read"
            raise exceptions.PermissionDenied(
                f"This needs the '{scope}' scope ({what}), which the caller lacks."
            )
        capability = getattr(view, "required_capability", None)
        if capability is not None and not can(principal, capability):
            raise exceptions.PermissionDenied(
                f"This needs the '{capability}' permission, which the caller's "
                "role or key does not grant."
            )
        return True
