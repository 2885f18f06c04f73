from django import forms
from django.contrib import admin, messages
from django.template.response import TemplateResponse

from audit.services import Actor
from runs import services
from runs.admin_scoping import TenantScopedAdmin, has_role, tenant_ids_for
from runs.models import ApiKey, Membership, Role, Scope, Tenant

ADMIN_ROLES = {Role.TENANT_ADMIN}
ALL_ROLES = set(Role.values)


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "created_at"]
    search_fields = ["slug", "name"]
    readonly_fields = ["created_at"]

    def get_queryset(self, request):
        queryset = super().get_queryset(request)
        if request.user.is_superuser:
            return queryset
        return queryset.filter(pk__in=tenant_ids_for(request.user))

    def has_module_permission(self, request):
        return has_role(request.user, ALL_ROLES)

    def has_view_permission(self, request, obj=None):
        return has_role(request.user, ALL_ROLES, obj.pk if obj else None)

    def has_add_permission(self, request):
        return request.user.is_superuser

    def has_change_permission(self, request, obj=None):
        return has_role(request.user, ADMIN_ROLES, obj.pk if obj else None)

    def has_delete_permission(self, request, obj=None):
        return False  # a tenant's audit trail must outlive it; no deletion here

    def save_model(self, request, obj, form, change):
        if change:
            super().save_model(request, obj, form, change)
            return
        created = services.tenant_create(
            slug=obj.slug, name=obj.name, actor=Actor.user(request.user)
        )
        obj.pk = created.pk


@admin.register(Membership)
class MembershipAdmin(TenantScopedAdmin):
    list_display = ["user", "tenant", "role", "created_at"]
    list_filter = ["role", "tenant"]
    search_fields = ["user__username", "tenant__slug"]
    view_roles = {Role.COMPLIANCE_OFFICER, Role.AUDITOR}
    manage_roles = ADMIN_ROLES

    def save_model(self, request, obj, form, change):
        membership = services.membership_set(
            tenant=obj.tenant,
            user=obj.user,
            role=obj.role,
            actor=Actor.user(request.user),
        )
        obj.pk = membership.pk

    def delete_model(self, request, obj):
        services.membership_remove(membership=obj, actor=Actor.user(request.user))

    def delete_queryset(self, request, queryset):
        for membership in queryset:
            self.delete_model(request, membership)


class ApiKeyCreateForm(forms.ModelForm):
    scopes = forms.MultipleChoiceField(
        choices=Scope.choices, widget=forms.CheckboxSelectMultiple
    )

    class Meta:
        model = ApiKey
        fields = ["tenant", "name", "scopes"]


@admin.register(ApiKey)
class ApiKeyAdmin(TenantScopedAdmin):
    list_display = [
        "name",
        "prefix",
        "tenant",
        "scopes",
        "created_at",
        "last_used_at",
        "revoked_at",
    ]
    list_filter = ["tenant", ("revoked_at", admin.EmptyFieldListFilter)]
    search_fields = ["name", "prefix"]
    readonly_fields = [
        "tenant",
        "prefix",
        "scopes",
        "created_at",
        "last_used_at",
        "revoked_at",
    ]
    fields = [
        "tenant",
        "name",
        "prefix",
        "scopes",
        "created_at",
        "last_used_at",
        "revoked_at",
    ]
    actions = ["revoke"]
    view_roles = {Role.COMPLIANCE_OFFICER, Role.AUDITOR}
    manage_roles = ADMIN_ROLES

    def get_form(self, request, obj=None, change=False, **kwargs):
        if obj is None:
            kwargs["form"] = ApiKeyCreateForm
            kwargs["fields"] = ["tenant", "name", "scopes"]
        return super().get_form(request, obj, change=change, **kwargs)

    def get_readonly_fields(self, request, obj=None):
        return self.readonly_fields if obj else []

    def get_fields(self, request, obj=None):
        return self.fields if obj else ["tenant", "name", "scopes"]

    def has_delete_permission(self, request, obj=None):
        return False  # keys are revoked, never deleted: the audit trail names them

    def save_model(self, request, obj, form, change):
        if change:
            super().save_model(request, obj, form, change)
            return
        issued = services.api_key_create(
            tenant=form.cleaned_data["tenant"],
            name=form.cleaned_data["name"],
            scopes=form.cleaned_data["scopes"],
            actor=Actor.user(request.user),
        )
        obj.pk = issued.api_key.pk
        obj.prefix = issued.api_key.prefix
        # Only this response shows the secret: it is never stored, not even in
        # the session or a flash message.
        request._gatehouse_new_secret = issued.secret

    def response_add(self, request, obj, post_url_continue=None):
        secret = getattr(request, "_gatehouse_new_secret", None)
        if secret is None:
            return super().response_add(request, obj, post_url_continue)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "api_key": obj,
            "secret": secret,
            "title": "API key created",
        }
        response = TemplateResponse(request, "admin/runs/apikey/created.html", context)
        response["Cache-Control"] = "no-store"
        return response

    @admin.action(description="Revoke the selected API keys")
    def revoke(self, request, queryset):
        revoked = 0
        for api_key in queryset.filter(revoked_at=None):
            if not self.has_change_permission(request, api_key):
                continue
            services.api_key_revoke(api_key=api_key, actor=Actor.user(request.user))
            revoked += 1
        self.message_user(request, f"Revoked {revoked} API key(s).", messages.SUCCESS)
        return None

    def get_actions(self, request):
        actions = super().get_actions(request)
        if not has_role(request.user, self.manage_roles):
            actions.pop("revoke", None)
        return actions

from runs import admin_threads  # noqa: E402,F401  threads and runs, read-only
