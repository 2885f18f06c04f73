"""Admin login lockouts (django-axes): seen and lifted by compliance officers.

A username locked out after repeated wrong passwords shows here to the
compliance officers of the tenants it is a member of (superusers see all);
the "Lift the lockout" action unlocks it at once, audited in those tenants.
Lockouts themselves are audited when they happen (runs.apps).
"""

from axes.models import AccessAttempt
from axes.signals import user_locked_out
from django.conf import settings
from django.contrib import admin, messages

from audit.services import Actor
from runs import permissions, services
from runs.admin_scoping import tenant_ids_for, user_can
from runs.models import Membership, Tenant

LIFT = permissions.LIFT_LOCKOUTS


def _usernames_in(tenant_ids: list[int]):
    return Membership.objects.filter(tenant_id__in=tenant_ids).values("user__username")


@admin.register(AccessAttempt)
class LoginLockoutAdmin(admin.ModelAdmin):
    list_display = ["username", "ip_address", "failures_since_start", "attempt_time"]
    list_filter = ["attempt_time"]
    search_fields = ["username", "ip_address"]
    fields = ["username", "ip_address", "failures_since_start", "attempt_time"]
    readonly_fields = fields
    actions = ["lift"]

    def get_queryset(self, request):
        queryset = (
            super()
            .get_queryset(request)
            .filter(failures_since_start__gte=settings.AXES_FAILURE_LIMIT)
        )
        if request.user.is_superuser:
            return queryset
        ids = tenant_ids_for(request.user, LIFT)
        return queryset.filter(username__in=_usernames_in(ids))

    def has_module_permission(self, request):
        return user_can(request.user, LIFT)

    def has_view_permission(self, request, obj=None):
        return user_can(request.user, LIFT)

    def has_change_permission(self, request, obj=None):
        return user_can(request.user, LIFT)

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.action(description="Lift the lockout")
    def lift(self, request, queryset):
        allowed = (
            None
            if request.user.is_superuser
            else set(tenant_ids_for(request.user, LIFT))
        )
        for username in sorted(set(queryset.values_list("username", flat=True))):
            tenants = Tenant.objects.filter(memberships__user__username=username)
            if allowed is not None:
                tenants = tenants.filter(pk__in=allowed)
            services.login_lockout_lift(
                username=username,
                actor=Actor.user(request.user),
                tenants=list(tenants.distinct().order_by("pk")),
            )
            self.message_user(request, f"{username} may log in again.", messages.INFO)


def _audit_lockout(*, request, username, ip_address, **kwargs) -> None:
    # django-axes also sends user_locked_out for every attempt made while
    # locked out; only the failure that locks is recorded.
    failures = getattr(request, "axes_failures_since_start", None)
    if failures == settings.AXES_FAILURE_LIMIT:
        services.login_lockout_record(
            username=username or "", ip_address=ip_address or "", failures=failures
        )


def connect_lockout_audit() -> None:
    user_locked_out.connect(_audit_lockout, dispatch_uid="gatehouse-login-lockout")
