"""Tenant scoping for admin pages: a staff user sees only their tenants' rows.

Superusers see every tenant. Everyone else sees the tenants of their
memberships, in lists, on change pages and in every foreign-key dropdown
(Django's admin would otherwise list every tenant's rows there). What a role
may do is decided on the server, in the has_*_permission methods, by the
capabilities of runs.permissions: an admin class names the capability its
rows need, never a role.
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.contrib.admin.views.main import ERROR_FLAG

from runs import permissions
from runs.models import Membership, Tenant


def memberships_of(user) -> list[tuple[int, str]]:
    """The user's (tenant id, role) pairs, read once per user object.

    An admin page asks for the user's roles many times (every registered
    model's permissions, for the index and the sidebar); `request.user` is a
    fresh object per request, so caching on it costs one query per page.
    """
    cached = getattr(user, "_gatehouse_memberships", None)
    if cached is None:
        cached = list(
            Membership.objects.filter(user=user).values_list("tenant_id", "role")
        )
        user._gatehouse_memberships = cached
    return cached


def roles_in(user, tenant_id: int) -> set[str]:
    return {role for tid, role in memberships_of(user) if tid == tenant_id}


def tenant_ids_for(user, capability: str | None = None) -> list[int]:
    """The tenants in which the user's role grants `capability` (any of
    their tenants when None)."""
    roles = None if capability is None else permissions.roles_with(capability)
    return [
        tenant_id
        for tenant_id, role in memberships_of(user)
        if roles is None or role in roles
    ]


def user_can(user, capability: str, tenant_id: int | None = None) -> bool:
    """Whether a staff user may do `capability` (runs.permissions) in the
    tenant (in any of theirs when `tenant_id` is None); superusers may."""
    if not (user.is_active and user.is_staff):
        return False
    if user.is_superuser:
        return True
    ids = tenant_ids_for(user, capability)
    return bool(ids) if tenant_id is None else tenant_id in ids


class TenantScopedAdmin(admin.ModelAdmin):
    """Base for admin classes of rows that belong to one tenant."""

    tenant_path = "tenant"
    # The capabilities (runs.permissions) to see these rows, and to add,
    # change or delete them (which lets one see them too); "" grants nothing.
    view_capability = ""
    manage_capability = ""

    def seen_in(self, user) -> list[int]:
        """The tenants whose rows the user sees here."""
        return sorted(
            set(tenant_ids_for(user, self.view_capability))
            | set(tenant_ids_for(user, self.manage_capability))
        )

    def may_see(self, user, tenant_id: int | None = None) -> bool:
        return user_can(user, self.view_capability, tenant_id) or user_can(
            user, self.manage_capability, tenant_id
        )

    def may_manage(self, user, tenant_id: int | None = None) -> bool:
        return user_can(user, self.manage_capability, tenant_id)

    def get_queryset(self, request):
        queryset = super().get_queryset(request)
        if request.user.is_superuser:
            return queryset
        ids = self.seen_in(request.user)
        return queryset.filter(**{f"{self.tenant_path}__in": ids})

    def changelist_view(self, request, extra_context=None):
        # Django's admin answers a filter it cannot apply (a day that does not
        # exist, 2026-02-30; a number that is not one) by showing the list
        # unfiltered under ?e=1: say so, rather than let it pass for the result.
        if ERROR_FLAG in request.GET:
            messages.warning(
                request,
                "A filter in the address was not valid (a date that does not "
                "exist, such as 2026-02-30, or a value of the wrong kind): the "
                "list below is not filtered.",
            )
        return super().changelist_view(request, extra_context)

    def get_changeform_initial_data(self, request):
        """An add form starts on the user's only tenant, when they have one
        they may add rows to (a superuser: when there is one tenant)."""
        initial = super().get_changeform_initial_data(request)
        if "tenant" not in initial:
            tenants = self.manageable_tenants(request)
            if len(tenants) == 1:
                initial["tenant"] = tenants[0]
        return initial

    def manageable_tenants(self, request) -> list[int]:
        """The ids of the tenants in which the user may add these rows."""
        if request.user.is_superuser:
            return list(Tenant.objects.values_list("pk", flat=True))
        return sorted(set(tenant_ids_for(request.user, self.manage_capability)))

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        related = db_field.related_model
        if not request.user.is_superuser:
            ids = tenant_ids_for(request.user, self.manage_capability)
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
        return self.may_see(request.user)

    def has_view_permission(self, request, obj=None) -> bool:
        return self.may_see(request.user, self._tenant_id_of(obj))

    def has_add_permission(self, request) -> bool:
        return self.may_manage(request.user)

    def has_change_permission(self, request, obj=None) -> bool:
        return self.may_manage(request.user, self._tenant_id_of(obj))

    def has_delete_permission(self, request, obj=None) -> bool:
        return self.may_manage(request.user, self._tenant_id_of(obj))


class ReadOnlyScopedAdmin(TenantScopedAdmin):
    """Rows nobody adds, changes or deletes in the admin (a trail, a record of
    what ran, a request decided on its own page): seen, and nothing else."""

    actions = None

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


class ScopedTenantFilter(admin.SimpleListFilter):
    """A tenant filter that lists only the tenants the user sees in this admin
    (Django's related-field filter would list every tenant)."""

    title = "tenant"
    parameter_name = "tenant"
    tenant_field = "tenant_id"

    def lookups(self, request, model_admin):
        tenants = Tenant.objects.all()
        if not request.user.is_superuser:
            tenants = tenants.filter(pk__in=model_admin.seen_in(request.user))
        return [(str(tenant.pk), tenant.slug) for tenant in tenants]

    def queryset(self, request, queryset):
        if self.value():
            return queryset.filter(**{self.tenant_field: self.value()})
        return queryset
