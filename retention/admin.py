"""Retention in the admin: policies (tenant admins), legal holds (compliance
officers), deletion requests (compliance officers ask, auditors read).

Every change goes through retention.services, so it is validated and audited
exactly as through any other way in.
"""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError

from audit.services import Actor
from retention import services
from retention.models import DeletionRequest, LegalHold, RetentionPolicy, ThreadRemoval
from runs import permissions
from runs.admin_scoping import TenantScopedAdmin
from runs.errors import StateConflict
from runs.models import Thread


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
        "thread",
        "placed_by",
        "placed_at",
        "lifted_at",
        "lifted_by",
    ]
    list_filter = [("lifted_at", admin.EmptyFieldListFilter)]
    readonly_fields = [
        "tenant",
        "thread",
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
        lifted = 0
        for hold in queryset.filter(lifted_at=None):
            if not self.may_manage(request.user, hold.tenant_id):
                continue
            try:
                services.legal_hold_lift(
                    hold=hold,
                    actor=Actor.user(request.user),
                    reason="lifted in the admin",
                )
            except StateConflict:
                continue
            lifted += 1
        self.message_user(request, f"Lifted {lifted} legal hold(s).", messages.SUCCESS)

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


class SubjectDeletionForm(forms.ModelForm):
    subject = forms.CharField(
        max_length=500,
        help_text="The data subject's identifier, as the agent tags threads with "
        "it (an e-mail address, a customer number). It is not stored: threads "
        "are found by its keyed hash.",
    )

    class Meta:
        model = DeletionRequest
        fields = ["tenant", "subject"]


@admin.register(DeletionRequest)
class DeletionRequestAdmin(TenantScopedAdmin):
    list_display = [
        "id",
        "tenant",
        "kind",
        "thread_ref",
        "status",
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
        "requested_by",
        "created_at",
        "updated_at",
        "completed_at",
        "record",
    ]
    inlines = [ThreadRemovalInline]
    view_capability = permissions.READ_DELETIONS
    manage_capability = permissions.REQUEST_DELETION

    def get_form(self, request, obj=None, change=False, **kwargs):
        if obj is None:
            kwargs["form"] = SubjectDeletionForm
            kwargs["fields"] = ["tenant", "subject"]
        return super().get_form(request, obj, change=change, **kwargs)

    def get_fields(self, request, obj=None):
        return self.readonly_fields if obj else ["tenant", "subject"]

    def get_readonly_fields(self, request, obj=None):
        return self.readonly_fields if obj else []

    def get_inlines(self, request, obj):
        return self.inlines if obj else []

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def save_model(self, request, obj, form, change):
        created = services.subject_deletion_request(
            tenant=form.cleaned_data["tenant"],
            subject=form.cleaned_data["subject"],
            actor=Actor.user(request.user),
        )
        obj.pk = created.pk
