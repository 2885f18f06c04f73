from django import forms
from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.http import urlencode
from django.views.decorators.http import require_POST

from audit.services import Actor
from runs import crypto, permissions, services
from runs.admin_scoping import (
    ScopedTenantFilter,
    TenantScopedAdmin,
    roles_in,
    tenant_ids_for,
    user_can,
)
from runs.models import ApiKey, Membership, Role, Scope, Tenant


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
        return user_can(request.user, permissions.VIEW_TENANT)

    def has_view_permission(self, request, obj=None):
        return user_can(request.user, permissions.VIEW_TENANT, obj.pk if obj else None)

    def has_add_permission(self, request):
        return request.user.is_superuser

    def has_change_permission(self, request, obj=None):
        return user_can(
            request.user, permissions.MANAGE_TENANT, obj.pk if obj else None
        )

    def has_delete_permission(self, request, obj=None):
        return False  # a tenant's audit trail must outlive it; no deletion here

    def save_model(self, request, obj, form, change):
        if change:
            services.tenant_update(
                tenant=obj, slug=obj.slug, name=obj.name, actor=Actor.user(request.user)
            )
            return
        created = services.tenant_create(
            slug=obj.slug, name=obj.name, actor=Actor.user(request.user)
        )
        obj.pk = created.pk


@admin.register(Membership)
class MembershipAdmin(TenantScopedAdmin):
    list_display = ["user", "tenant", "role", "created_at"]
    list_filter = ["role", ScopedTenantFilter]
    search_fields = ["user__username", "tenant__slug"]
    view_capability = permissions.VIEW_MEMBERS
    manage_capability = permissions.MANAGE_MEMBERS

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        if db_field.name == "user" and not request.user.is_superuser:
            # The members of the tenants this user manages, and nobody else.
            ids = tenant_ids_for(request.user, self.manage_capability)
            kwargs["queryset"] = (
                get_user_model()
                .objects.filter(memberships__tenant_id__in=ids)
                .exclude(pk=request.user.pk)
                .distinct()
                .order_by("username")
            )
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def _own(self, request, obj) -> bool:
        return obj is not None and obj.user_id == request.user.pk

    def has_change_permission(self, request, obj=None):
        if self._own(request, obj) and not request.user.is_superuser:
            return False  # no one raises their own role
        return super().has_change_permission(request, obj)

    def has_delete_permission(self, request, obj=None):
        if self._own(request, obj) and not request.user.is_superuser:
            return False
        return super().has_delete_permission(request, obj)

    def save_model(self, request, obj, form, change):
        if self._own(request, obj) and not request.user.is_superuser:
            raise PermissionDenied
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


SCOPES_HELP = (
    "time_travel allows forks and runs from a checkpoint; no other scope "
    "implies it. Approvals decided with a service key count as one approval "
    "at most, whatever reviewer name it sends: people decide with a session "
    "or their own personal key."
)


def _checked_name(tenant, name: str, excluding: int | None = None) -> str:
    """The key name by the service's rule (not empty, unique in the tenant),
    as a form error."""
    try:
        return services.api_key_name_check(
            tenant=tenant, name=name, excluding=excluding
        )
    except ValueError as exc:
        raise forms.ValidationError(str(exc)) from None


class NewKeyNameRule:
    """For the forms that make a key: its name checked in the chosen tenant."""

    def clean(self):
        cleaned = super().clean()
        if cleaned.get("tenant") is not None and "name" in cleaned:
            try:
                cleaned["name"] = _checked_name(cleaned["tenant"], cleaned["name"])
            except forms.ValidationError as error:
                self.add_error("name", error)
        return cleaned


class ApiKeyCreateForm(NewKeyNameRule, forms.ModelForm):
    """A service key (a program's). Personal keys are made by their owners
    (My personal API keys), so that nobody else ever holds their secret."""

    scopes = forms.MultipleChoiceField(
        choices=Scope.choices,
        widget=forms.CheckboxSelectMultiple,
        help_text=SCOPES_HELP,
    )

    class Meta:
        model = ApiKey
        fields = ["tenant", "name", "scopes"]
        help_texts = {"name": "What uses the key, e.g. billing. Unique in the tenant."}


class ApiKeyChangeForm(forms.ModelForm):
    """Renaming a key: the only change a key takes."""

    class Meta:
        model = ApiKey
        fields = ["name"]

    def clean_name(self):
        return _checked_name(
            self.instance.tenant, self.cleaned_data["name"], excluding=self.instance.pk
        )


class PersonalKeyForm(NewKeyNameRule, forms.Form):
    """A personal key of one of the user's memberships."""

    tenant = forms.ModelChoiceField(queryset=None)
    name = forms.CharField(max_length=200)
    scopes = forms.MultipleChoiceField(
        choices=Scope.choices,
        widget=forms.CheckboxSelectMultiple,
        help_text="Within what your role grants in that tenant.",
    )

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        tenants = Tenant.objects.filter(memberships__user=user).order_by("slug")
        self.fields["tenant"].queryset = tenants
        if len(tenants) == 1:  # the user's only tenant, chosen already
            self.fields["tenant"].initial = tenants[0].pk


def _within_scopes(form_class, allowed: frozenset[str]):
    """The key form offering, and accepting, only the scopes `allowed`: no one
    issues a key that can do more than they can."""

    class Within(form_class):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.fields["scopes"].choices = [
                (value, label) for value, label in Scope.choices if value in allowed
            ]

    return Within


@admin.register(ApiKey)
class ApiKeyAdmin(TenantScopedAdmin):
    list_display = [
        "name",
        "prefix",
        "kind",
        "user",
        "tenant",
        "scope_labels",
        "created_at",
        "last_used_at",
        "revoked_at",
    ]
    list_filter = [
        "kind",
        ScopedTenantFilter,
        ("revoked_at", admin.EmptyFieldListFilter),
    ]
    list_select_related = ["tenant", "user"]
    search_fields = ["name", "prefix"]
    readonly_fields = [
        "tenant",
        "prefix",
        "kind",
        "user",
        "scope_labels",
        "withheld",
        "created_at",
        "last_used_at",
        "revoked_at",
    ]
    fields = [
        "tenant",
        "name",
        "prefix",
        "kind",
        "user",
        "scope_labels",
        "withheld",
        "created_at",
        "last_used_at",
        "revoked_at",
    ]
    actions = ["revoke"]
    view_capability = permissions.VIEW_KEYS
    manage_capability = permissions.ISSUE_KEYS

    @admin.display(description="scopes")
    def scope_labels(self, obj):
        return obj.scope_labels

    def get_form(self, request, obj=None, change=False, **kwargs):
        if obj is None:
            kwargs["form"] = ApiKeyCreateForm
            kwargs["fields"] = ["tenant", "name", "scopes"]
        else:
            kwargs["form"] = ApiKeyChangeForm
        form = super().get_form(request, obj, change=change, **kwargs)
        if obj is None and not request.user.is_superuser:
            return _within_scopes(form, permissions.role_scopes(Role.TENANT_ADMIN))
        return form

    def get_readonly_fields(self, request, obj=None):
        return self.readonly_fields if obj else []

    def get_fields(self, request, obj=None):
        return self.fields if obj else ["tenant", "name", "scopes"]

    def has_delete_permission(self, request, obj=None):
        return False  # keys are revoked, never deleted: the audit trail names them

    def save_model(self, request, obj, form, change):
        if change:  # only the name is editable
            services.api_key_rename(
                api_key=obj, name=obj.name, actor=Actor.user(request.user)
            )
            return
        tenant, scopes = form.cleaned_data["tenant"], form.cleaned_data["scopes"]
        issued = services.api_key_create(
            tenant=tenant,
            name=form.cleaned_data["name"],
            scopes=scopes,
            actor=Actor.user(request.user),
            # A superuser is the operator: what they issue, they could do.
            withheld=[]
            if request.user.is_superuser
            else permissions.withheld_from_key(
                roles_in(request.user, tenant.pk), scopes
            ),
        )
        obj.pk = issued.api_key.pk
        obj.prefix = issued.api_key.prefix
        request._gatehouse_issued = issued

    def response_add(self, request, obj, post_url_continue=None):
        issued = getattr(request, "_gatehouse_issued", None)
        if issued is None:
            return super().response_add(request, obj, post_url_continue)
        return self._hand_over(request, issued)

    # --- The secret, shown once ----------------------------------------------------
    # Creating a key redirects to its "created" page (so a reload or Back
    # re-posts nothing and makes no second key). The secret crosses the
    # redirect sealed under a one-time key (runs.crypto.handoff_seal): the
    # sealed text waits in the creator's session, the key rides in the URL,
    # and the page takes the sealed text out of the session as it shows it.
    # The database never holds the secret in the clear, not even for a moment,
    # and a second visit finds nothing to show.

    HANDOFF_SESSION_KEY = "gatehouse_new_api_key"

    def _hand_over(self, request, issued: services.IssuedApiKey):
        key, sealed = crypto.handoff_seal(issued.secret)
        # By key id: keys made in two tabs at once each wait for their page.
        waiting = request.session.get(self.HANDOFF_SESSION_KEY, {})
        request.session[self.HANDOFF_SESSION_KEY] = {
            **waiting,
            str(issued.api_key.pk): sealed,
        }
        url = reverse("admin:runs_apikey_created", args=[issued.api_key.pk])
        return HttpResponseRedirect(f"{url}?{urlencode({'k': key})}")

    def created_view(self, request, key_id):
        api_key = ApiKey.objects.select_related("tenant").filter(pk=key_id).first()
        if api_key is None or not self._may_see_created(request, api_key):
            raise Http404("no such key")
        secret = None
        waiting = dict(request.session.get(self.HANDOFF_SESSION_KEY, {}))
        sealed = waiting.pop(str(api_key.pk), None)
        if sealed is not None:  # taken out as it is shown: once only
            request.session[self.HANDOFF_SESSION_KEY] = waiting
            secret = crypto.handoff_open(request.GET.get("k", ""), sealed)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "api_key": api_key,
            "secret": secret,
            "title": "API key created",
        }
        response = TemplateResponse(request, "admin/runs/apikey/created.html", context)
        response["Cache-Control"] = "no-store"
        return response

    def _may_see_created(self, request, api_key: ApiKey) -> bool:
        if api_key.is_personal:
            return api_key.user_id == request.user.pk
        return self.has_view_permission(request, api_key)

    # --- My personal API keys: every member makes and revokes their own ------------

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        try:
            return super().changeform_view(request, object_id, form_url, extra_context)
        except services.ApiKeyNameTaken as exc:
            # Taken between the form's check and the save (another tab, another
            # admin): nothing was saved; say so on the form again.
            self.message_user(request, str(exc), messages.ERROR)
            return HttpResponseRedirect(request.get_full_path())

    def get_urls(self):
        wrap = self.admin_site.admin_view
        return [
            path(
                "<int:key_id>/created/",
                wrap(self.created_view),
                name="runs_apikey_created",
            ),
            path(
                "personal/",
                wrap(self.personal_keys_view),
                name="runs_apikey_personal",
            ),
            path(
                "personal/<int:key_id>/revoke/",
                wrap(require_POST(self.personal_key_revoke_view)),
                name="runs_apikey_personal_revoke",
            ),
        ] + super().get_urls()

    def personal_keys_view(self, request):
        if not user_can(request.user, permissions.VIEW_TENANT):
            raise PermissionDenied
        form = PersonalKeyForm(request.POST or None, user=request.user)
        if request.method == "POST" and form.is_valid():
            try:
                issued = services.api_key_create(
                    tenant=form.cleaned_data["tenant"],
                    name=form.cleaned_data["name"],
                    scopes=form.cleaned_data["scopes"],
                    actor=Actor.user(request.user),
                    user=request.user,
                )
            except ValueError as exc:
                form.add_error("scopes", str(exc))
            else:
                return self._hand_over(request, issued)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "My personal API keys",
            "form": form,
            "keys": ApiKey.objects.filter(
                user=request.user, kind=ApiKey.Kind.PERSONAL
            ).select_related("tenant"),
        }
        return TemplateResponse(request, "admin/runs/apikey/personal.html", context)

    def personal_key_revoke_view(self, request, key_id):
        api_key = ApiKey.objects.filter(
            pk=key_id, user=request.user, kind=ApiKey.Kind.PERSONAL
        ).first()
        if api_key is None:
            raise Http404("no such key of yours")
        services.api_key_revoke(api_key=api_key, actor=Actor.user(request.user))
        messages.success(request, f"Revoked {api_key.prefix}.")
        return HttpResponseRedirect(reverse("admin:runs_apikey_personal"))

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
        if not self.may_manage(request.user):
            actions.pop("revoke", None)
        return actions


from runs import admin_logins, admin_threads  # noqa: E402,F401  lockouts; threads and runs
