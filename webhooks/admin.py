"""Webhook subscriptions (tenant admins manage them) and the delivery log."""

from __future__ import annotations

from django import forms
from django.contrib import admin
from django.template.response import TemplateResponse

from audit.services import Actor
from runs import permissions
from runs.admin_scoping import (
    ReadOnlyScopedAdmin,
    ScopedTenantFilter,
    TenantScopedAdmin,
    user_can,
)
from runs.errors import InvalidRequest
from webhooks import services
from webhooks.models import EVENTS, WebhookDelivery, WebhookSubscription


class SubscriptionCreateForm(forms.ModelForm):
    url = forms.URLField(max_length=2000, assume_scheme="https")
    events = forms.MultipleChoiceField(
        choices=[(name, name) for name in EVENTS],
        widget=forms.CheckboxSelectMultiple,
        required=False,
        help_text="None: an endpoint that runs' own webhooks (webhook=) may post to.",
    )

    class Meta:
        model = WebhookSubscription
        fields = ["tenant", "url", "events", "include_content"]

    # The user adding it (set by the admin): thread content goes only where
    # someone who may read it says.
    user = None

    def clean_url(self):
        try:
            return services.url_check(self.cleaned_data["url"])
        except InvalidRequest as refused:
            raise forms.ValidationError(refused.detail["url"]) from None

    def clean(self):
        cleaned = super().clean()
        tenant = cleaned.get("tenant")
        if (
            cleaned.get("include_content")
            and tenant is not None
            and not user_can(self.user, permissions.READ_STATE, tenant.pk)
        ):
            self.add_error("include_content", services.CONTENT_REFUSED)
        return cleaned


@admin.register(WebhookSubscription)
class WebhookSubscriptionAdmin(TenantScopedAdmin):
    list_display = ["url", "tenant", "events", "include_content", "created_at"]
    list_filter = [ScopedTenantFilter]
    fields = ["tenant", "url", "events", "include_content", "created_by", "created_at"]
    readonly_fields = fields
    view_capability = permissions.VIEW_WEBHOOKS
    manage_capability = permissions.MANAGE_WEBHOOKS

    def get_form(self, request, obj=None, change=False, **kwargs):
        if obj is None:
            kwargs["form"] = type(
                "SubscriptionCreateForm",
                (SubscriptionCreateForm,),
                {"user": request.user},
            )
        return super().get_form(request, obj, change=change, **kwargs)

    def get_fields(self, request, obj=None):
        return self.fields if obj else SubscriptionCreateForm.Meta.fields

    def get_readonly_fields(self, request, obj=None):
        return self.readonly_fields if obj else []

    def has_change_permission(self, request, obj=None) -> bool:
        return False  # delete and create anew: the secret goes with the row

    def save_model(self, request, obj, form, change):
        issued = services.subscription_create(
            tenant=form.cleaned_data["tenant"],
            url=form.cleaned_data["url"],
            events_wanted=form.cleaned_data["events"],
            include_content=form.cleaned_data["include_content"],
            actor=Actor.user(request.user),
        )
        obj.pk = issued.subscription.pk
        # Only this response shows the secret; it is stored wrapped, never shown.
        request._gatehouse_new_secret = issued.secret

    def response_add(self, request, obj, post_url_continue=None):
        secret = getattr(request, "_gatehouse_new_secret", None)
        if secret is None:
            return super().response_add(request, obj, post_url_continue)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "subscription": WebhookSubscription.objects.get(pk=obj.pk),
            "secret": secret,
            "title": "Webhook subscription created",
        }
        response = TemplateResponse(
            request, "admin/webhooks/webhooksubscription/created.html", context
        )
        response["Cache-Control"] = "no-store"
        return response

    def delete_model(self, request, obj):
        services.subscription_delete(subscription=obj, actor=Actor.user(request.user))

    def delete_queryset(self, request, queryset):
        for subscription in queryset:
            self.delete_model(request, subscription)


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(ReadOnlyScopedAdmin):
    """The delivery log: what was sent where and how it went, never the body."""

    list_display = [
        "event_type",
        "target",
        "tenant",
        "status",
        "attempts",
        "last_status_code",
        "last_error",
        "created_at",
        "delivered_at",
    ]
    list_filter = [ScopedTenantFilter, "status", "event_type"]
    fields = list_display + ["next_attempt_at"]
    readonly_fields = fields
    # Read-only (ReadOnlyScopedAdmin): the managers see it too.
    view_capability = permissions.VIEW_WEBHOOKS
    manage_capability = permissions.MANAGE_WEBHOOKS
