"""Tenant scoping for admin pages: a staff user sees only their tenants' rows.

Superusers see every tenant. Everyone else sees the tenants of their
memberships, in lists, on change pages and in every foreign-key dropdown
(Django's admin would otherwise list every tenant's rows there). What a role
may do is decided on the server, in the has_*_permission methods.
"""

from __future__ import annotations

from django.contrib import admin

from runs.models import Membership, Tenant


def tenant_ids_for(user, roles: set[str] | None = None) -> list[int]:
    memberships = Membership.objects.filter(user=user)
    if roles is not None:
        memberships = memberships.filter(role__in=roles)
    return list(memberships.values_list("tenant_id", flat=True))


def has_role(user, roles: set[str], tenant_id: int | None = None) -> bool:
    if not (user.is_active and user.is_staff):
        return False
    if user.is_superuser:
        return True
    ids = tenant_ids_for(user, roles)
    return bool(ids) if tenant_id is None else tenant_id in ids


class TenantScopedAdmin(admin.ModelAdmin):
    """Base for admin classes of rows that belong to one tenant."""

    tenant_path = "tenant"
    # Roles that may see these rows; and roles that may add, change or delete.
    view_roles: set[str] = set()
    manage_roles: set[str] = set()

    def get_queryset(self, request):
        queryset = super().get_queryset(request)
        if request.user.is_superuser:
            return queryset
        ids = tenant_ids_for(request.user, self.view_roles | self.manage_roles)
        return queryset.filter(**{f"{self.tenant_path}__in": ids})

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        related = db_field.related_model
        if not request.user.is_superuser:
            ids = tenant_ids_for(request.user, self.manage_roles)
            if related is Tenant:
                kwargs["queryset"] = Tenant.objects.filter(pk__in=ids)
            elif any(f.name == "tenant" for f in related._meta.get_fields()):
                kwargs["queryset"] = related._default_manager.filter(tenant__in=ids)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def _tenant_id_of(self, obj) -> int | None:
        if obj is None:
            return None
        target = obj
        for part in self.tenant_path.split("__"):
            target = getattr(target, part)
        return target.pk

    def has_module_permission(self, request) -> bool:
        return has_role(request.user, self.view_roles | self.manage_roles)

    def has_view_permission(self, request, obj=None) -> bool:
        return has_role(
            request.user, self.view_roles | self.manage_roles, self._tenant_id_of(obj)
        )

    def has_add_permission(self, request) -> bool:
        return has_role(request.user, self.manage_roles)

    def has_change_permission(self, request, obj=None) -> bool:
        return has_role(request.user, self.manage_roles, self._tenant_id_of(obj))

    def has_delete_permission(self, request, obj=None) -> bool:
        return has_role(request.user, self.manage_roles, self._tenant_id_of(obj))
