"""Retention in the admin: policies (tenant admins), legal holds (compliance
officers), deletion requests (compliance officers ask, auditors read).

Every change goes through retention.services, so it is validated and audited
exactly as through any other way in.
"""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from audit.services import Actor
from retention import selectors, services
from retention.models import DeletionRequest, LegalHold, RetentionPolicy, ThreadRemoval
from runs import permissions
from runs.admin_scoping import TenantScopedAdmin
from runs.errors import StateConflict
from runs.models import Tenant, Thread


def policy_in_words(policy: RetentionPolicy) -> list[tuple[str, str]]:
    """(field name, value as a person reads it) for each rule of a policy."""
    chain = "; ".join(
        f"{step['name']}: {step['after_hours']} h later, notify "
        + ", ".join(step["notify"])
        for step in policy.escalation_chain
    )
    return [
        ("checkpoint_ttl_days", f"{policy.checkpoint_ttl_days} days"),
        ("keep_latest_checkpoints", str(policy.keep_latest_checkpoints)),
        ("audit_retention_days", f"{policy.audit_retention_days} days"),
        ("approval_due_hours_low", f"{policy.approval_due_hours_low} h"),
        ("approval_due_hours_medium", f"{policy.approval_due_hours_medium} h"),
        ("approval_due_hours_high", f"{policy.approval_due_hours_high} h"),
        ("escalation_chain", chain),
        ("expire_after_hours", f"{policy.expire_after_hours} h"),
        ("final_action", policy.get_final_action_display()),
    ]


@admin.register(RetentionPolicy)
class RetentionPolicyAdmin(TenantScopedAdmin):
    list_display = [
        "tenant",
        "checkpoint_ttl_days",
        "keep_latest_checkpoints",
        "audit_retention_days",
        "expire_after_hours",
        "updated_at",
        "updated_by",
    ]
    readonly_fields = ["updated_at", "updated_by"]
    fieldsets = [
        (None, {"fields": ["tenant"]}),
        (
            "Threads and checkpoints",
            {"fields": ["checkpoint_ttl_days", "keep_latest_checkpoints"]},
        ),
        ("Audit trail", {"fields": ["audit_retention_days"]}),
        (
            "Approvals",
            {
                "fields": [
                    "approval_due_hours_low",
                    "approval_due_hours_medium",
                    "approval_due_hours_high",
                    "escalation_chain",
                    "expire_after_hours",
                    "final_action",
                ]
            },
        ),
        (None, {"fields": ["updated_at", "updated_by"]}),
    ]
    view_capability = permissions.VIEW_POLICY
    manage_capability = permissions.MANAGE_POLICY

    def get_readonly_fields(self, request, obj=None):
        # The tenant of an existing policy does not change.
        return [*self.readonly_fields, "tenant"] if obj else self.readonly_fields

    def has_delete_permission(self, request, obj=None):
        return False  # edit it instead; every change is audited

    def save_model(self, request, obj, form, change):
        services.retention_policy_save(policy=obj, actor=Actor.user(request.user))

    def changelist_view(self, request, extra_context=None):
        """Beside the policies, the defaults in force for the tenants that
        have none of their own (RetentionPolicy.for_tenant)."""
        visible = Tenant.objects.order_by("slug")
        if not request.user.is_superuser:
            visible = visible.filter(pk__in=self.seen_in(request.user))
        without = list(visible.filter(retention_policy__isnull=True))
        defaults = RetentionPolicy()
        extra_context = {
            **(extra_context or {}),
            "tenants_on_defaults": without,
            "defaults_in_force": [
                (RetentionPolicy._meta.get_field(name).verbose_name, value)
                for name, value in policy_in_words(defaults)
            ],
            "may_add_policy": self.has_add_permission(request),
        }
        return super().changelist_view(request, extra_context)


class LegalHoldForm(forms.ModelForm):
    thread_ref = forms.CharField(
        label="Thread id",
        required=False,
        max_length=255,
        help_text="The client's thread id. Leave empty to hold the whole tenant.",
    )

    class Meta:
        model = LegalHold
        fields = ["tenant", "thread_ref", "reason"]

    def clean(self):
        cleaned = super().clean()
        tenant, ref = cleaned.get("tenant"), (cleaned.get("thread_ref") or "").strip()
        cleaned["thread"] = None
        if tenant is not None and ref:
            thread = Thread.objects.for_tenant(tenant).filter(thread_id=ref).first()
            if thread is None:
                raise ValidationError(
                    {"thread_ref": f"tenant {tenant} has no live thread {ref!r}"}
                )
            cleaned["thread"] = thread
        return cleaned


@admin.register(LegalHold)
class LegalHoldAdmin(TenantScopedAdmin):
    form = LegalHoldForm
    list_display = [
        "__str__",
        "tenant",
        "covers",
        "placed_by",
        "placed_at",
        "lifted_at",
        "lifted_by",
    ]
    list_filter = [("lifted_at", admin.EmptyFieldListFilter)]
    readonly_fields = [
        "tenant",
        "covers",
        "reason",
        "placed_by",
        "placed_at",
        "lifted_at",
        "lifted_by",
        "lift_reason",
    ]
    actions = ["lift"]
    view_capability = permissions.VIEW_HOLDS
    manage_capability = permissions.MANAGE_HOLDS

    @admin.display(description="covers")
    def covers(self, hold):
        return hold.covers

    def get_fields(self, request, obj=None):
        return self.readonly_fields if obj else ["tenant", "thread_ref", "reason"]

    def get_readonly_fields(self, request, obj=None):
        return self.readonly_fields if obj else []

    def has_change_permission(self, request, obj=None):
        return False  # a hold is placed or lifted, never edited

    def has_delete_permission(self, request, obj=None):
        return False

    def save_model(self, request, obj, form, change):
        hold = services.legal_hold_place(
            tenant=form.cleaned_data["tenant"],
            thread=form.cleaned_data["thread"],
            reason=form.cleaned_data["reason"],
            actor=Actor.user(request.user),
        )
        obj.pk = hold.pk

    @admin.action(description="Lift the selected legal holds")
    def lift(self, request, queryset):
        """First a confirmation page (what the holds cover, the deletion
        requests that go ahead once they are lifted, a reason); then the lift."""
        holds = [
            hold
            for hold in queryset.filter(lifted_at=None).select_related(
                "tenant", "thread"
            )
            if self.may_manage(request.user, hold.tenant_id)
        ]
        reason = (request.POST.get("lift_reason") or "").strip()
        if request.POST.get("confirmed") != "yes" or not reason:
            return self._lift_confirmation(request, holds, asked=bool(reason))
        lifted = 0
        for hold in holds:
            try:
                services.legal_hold_lift(
                    hold=hold, actor=Actor.user(request.user), reason=reason
                )
            except StateConflict:
                continue
            lifted += 1
        self.message_user(request, f"Lifted {lifted} legal hold(s).", messages.SUCCESS)
        return None

    def _lift_confirmation(self, request, holds, *, asked: bool):
        waiting = DeletionRequest.objects.filter(
            tenant_id__in={hold.tenant_id for hold in holds},
            status=DeletionRequest.Status.ON_HOLD,
        ).select_related("tenant")
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Lift legal holds?",
            "holds": holds,
            "waiting": waiting,
            "reason_missing": request.POST.get("confirmed") == "yes" and not asked,
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        }
        return TemplateResponse(
            request, "admin/retention/legalhold/lift_confirmation.html", context
        )

    def get_actions(self, request):
        actions = super().get_actions(request)
        if not self.may_manage(request.user):
            actions.pop("lift", None)
        return actions


class ThreadRemovalInline(admin.TabularInline):
    model = ThreadRemoval
    fields = ["thread", "reason", "removed_at", "removed"]
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


class DeletionRequestForm(forms.Form):
    """A deletion request: a data subject's threads, or one thread."""

    tenant = forms.ModelChoiceField(queryset=Tenant.objects.none())
    subject = forms.CharField(
        required=False,
        max_length=500,
        help_text="The data subject's identifier, as the agent tags threads with "
        "it (an e-mail address, a customer number). It is not stored: threads "
        "are found by its keyed hash.",
    )
    thread_ref = forms.CharField(
        label="or thread id",
        required=False,
        max_length=255,
        help_text="The client's id of one thread to delete.",
    )

    def __init__(self, *args, tenants, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["tenant"].queryset = tenants

    def clean(self):
        cleaned = super().clean()
        subject = (cleaned.get("subject") or "").strip()
        ref = (cleaned.get("thread_ref") or "").strip()
        if bool(subject) == bool(ref):
            raise ValidationError("Give a data subject or a thread id (one of them).")
        cleaned["subject"], cleaned["thread_ref"], cleaned["thread"] = (
            subject,
            ref,
            None,
        )
        tenant = cleaned.get("tenant")
        if ref and tenant is not None:
            cleaned["thread"] = (
                Thread.objects.for_tenant(tenant).filter(thread_id=ref).first()
            )
            if cleaned["thread"] is None:
                self.add_error("thread_ref", f"{tenant} has no live thread {ref!r}")
        return cleaned


@admin.register(DeletionRequest)
class DeletionRequestAdmin(TenantScopedAdmin):
    """Adding a request shows what it would delete first (the threads, the
    approval requests it would close); only the confirmation makes it."""

    list_display = [
        "id",
        "tenant",
        "kind",
        "thread_ref",
        "status",
        "outcome",
        "requested_by",
        "created_at",
        "completed_at",
    ]
    list_filter = ["status", "kind"]
    readonly_fields = [
        "tenant",
        "kind",
        "thread_ref",
        "status",
        "outcome",
        "requested_by",
        "created_at",
        "updated_at",
        "completed_at",
        "record",
    ]
    inlines = [ThreadRemovalInline]
    view_capability = permissions.READ_DELETIONS
    manage_capability = permissions.REQUEST_DELETION
    CONFIRMED = "_confirmed"

    @admin.display(description="outcome")
    def outcome(self, request_row):
        return request_row.outcome

    def get_fields(self, request, obj=None):
        return self.readonly_fields

    def get_inlines(self, request, obj):
        return self.inlines if obj else []

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def add_view(self, request, form_url="", extra_context=None):
        if not self.has_add_permission(request):
            raise PermissionDenied
        tenants = Tenant.objects.filter(pk__in=self.manageable_tenants(request))
        initial = self.get_changeform_initial_data(request)
        form = DeletionRequestForm(
            request.POST or None, tenants=tenants, initial=initial
        )
        if request.method == "POST" and form.is_valid():
            if self.CONFIRMED in request.POST:
                created = self._make(request, form.cleaned_data)
                if created is not None:
                    return HttpResponseRedirect(
                        reverse(
                            "admin:retention_deletionrequest_change",
                            args=[created.pk],
                        )
                    )
            else:
                return self._confirmation(request, form)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Request a deletion",
            "form": form,
        }
        return TemplateResponse(
            request, "admin/retention/deletionrequest/request.html", context
        )

    def _confirmation(self, request, form):
        data = form.cleaned_data
        preview = selectors.deletion_preview(
            tenant=data["tenant"], subject=data["subject"], thread_id=data["thread_ref"]
        )
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Confirm the deletion",
            "form": form,
            "tenant": data["tenant"],
            "what": (
                f"thread {data['thread_ref']}"
                if data["thread_ref"]
                else "the data subject's threads"
            ),
            "preview": preview,
            "confirmed_field": self.CONFIRMED,
        }
        response = TemplateResponse(
            request, "admin/retention/deletionrequest/confirm.html", context
        )
        # The page repeats the subject the officer typed: keep it out of caches.
        response["Cache-Control"] = "no-store"
        return response

    def _make(self, request, data) -> DeletionRequest | None:
        actor = Actor.user(request.user)
        try:
            if data["thread"] is not None:
                made = services.thread_deletion_request(
                    thread=data["thread"], actor=actor
                )
            else:
                made = services.subject_deletion_request(
                    tenant=data["tenant"], subject=data["subject"], actor=actor
                )
        except StateConflict as exc:  # deleted meanwhile by someone else
            self.message_user(request, str(exc), messages.ERROR)
            return None
        self.message_user(
            request, f"Deletion requested: {made.outcome}", messages.SUCCESS
        )
        return made
