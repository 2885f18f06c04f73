"""The audit trail in the admin: read-only for everyone, superusers included.

Auditors, compliance officers and tenant admins see their tenants' events,
blocks and verifications; nobody can add, change or delete them here (the
database refuses it too, see migration 0003).
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import OuterRef, Subquery
from django.http import Http404, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.http import urlencode
from django.views.decorators.http import require_POST

from audit import anchors, events, selectors, services
from audit.models import AuditBlock, AuditEvent, AuditVerification
from runs import permissions
from runs.admin_scoping import ReadOnlyScopedAdmin, tenant_ids_for, user_can
from runs.models import Tenant, Thread


def visible_tenants(request):
    tenants = Tenant.objects.all()
    if not request.user.is_superuser:
        tenants = tenants.filter(
            pk__in=tenant_ids_for(request.user, permissions.READ_AUDIT)
        )
    return tenants


class TenantFilter(admin.SimpleListFilter):
    """Only the tenants the user may see; Django's related filter would list
    every tenant (or scan the whole events table for the ones in use)."""

    title = "tenant"
    parameter_name = "tenant"

    def lookups(self, request, model_admin):
        return [(str(t.pk), t.slug) for t in visible_tenants(request)]

    def queryset(self, request, queryset):
        if self.value():
            return queryset.filter(tenant_id=self.value())
        return queryset


class KindFilter(admin.SimpleListFilter):
    """The declared kinds, without a DISTINCT over the whole table."""

    title = "kind"
    parameter_name = "kind"

    def lookups(self, request, model_admin):
        return [(name, name) for name in sorted(events.REGISTRY)]

    def queryset(self, request, queryset):
        if self.value():
            return queryset.filter(kind=self.value())
        return queryset


class ReadsFilter(admin.SimpleListFilter):
    """Reads of decrypted content are many and routine: hidden with one click
    (or shown alone, to see who read what)."""

    title = "reads of content"
    parameter_name = "reads"

    def lookups(self, request, model_admin):
        return [("hide", "Hide reads"), ("only", "Only reads")]

    def queryset(self, request, queryset):
        if self.value() == "hide":
            return queryset.exclude(kind__in=events.READS)
        if self.value() == "only":
            return queryset.filter(kind__in=events.READS)
        return queryset


SHORT_ID = 8


def short_id(value: str, url: str = "") -> str:
    """An id cut to its first characters, the whole of it on hover; a link
    when `url` is given."""
    if not value:
        return "-"
    shown = value if len(value) <= SHORT_ID + 1 else value[:SHORT_ID] + "…"
    if url:
        return format_html('<a href="{}" title="{}">{}</a>', url, value, shown)
    return format_html('<span title="{}">{}</span>', value, shown)


def _url(name: str, *args) -> str:
    """A page of another app, by name (audit imports none of their admins)."""
    try:
        return reverse(name, args=args)
    except NoReverseMatch:
        return ""


class ReadOnlyAuditAdmin(ReadOnlyScopedAdmin):
    view_capability = permissions.READ_AUDIT
    show_full_result_count = False  # a COUNT(*) over the trail is slow


def latest_verifications(request):
    """The latest verification of each tenant the user sees, broken first."""
    latest = (
        AuditVerification.objects.filter(tenant=OuterRef("pk"))
        .order_by("-checked_at")
        .values("pk")[:1]
    )
    ids = (
        visible_tenants(request)
        .annotate(latest=Subquery(latest))
        .exclude(latest=None)
        .values_list("latest", flat=True)
    )
    rows = list(
        AuditVerification.objects.filter(pk__in=list(ids)).select_related("tenant")
    )
    for row in rows:
        row.signed = anchors.verification_is_signed(row)
    # Broken and unsigned (written behind Gatehouse's back) first.
    return sorted(rows, key=lambda row: (row.ok and row.signed, row.tenant.slug))[:50]


@admin.register(AuditEvent)
class AuditEventAdmin(ReadOnlyAuditAdmin):
    list_display = [
        "seq",
        "occurred_at",
        "tenant",
        "kind",
        "actor_label",
        "summary",
        "thread_link",
        "run_link",
        "request_link",
    ]
    list_filter = [ReadsFilter, TenantFilter, KindFilter, "actor_type"]
    list_select_related = ["tenant"]
    date_hierarchy = "occurred_at"
    # Exact matches only: a LIKE over the whole trail does not use an index.
    search_fields = ["=thread_id", "=run_id", "=action"]
    ordering = ["-occurred_at", "-seq"]
    fields = [
        "tenant",
        "seq",
        "occurred_at",
        "kind",
        "summary",
        "actor_type",
        "actor_id",
        "actor_label",
        "actor_on_behalf_of",
        "thread_link",
        "run_link",
        "request_link",
        "action",
        "data",
    ]
    readonly_fields = fields
    change_list_template = "admin/audit/auditevent/change_list.html"

    def get_list_display(self, request):
        shown = list(super().get_list_display(request))
        if not request.user.is_superuser and len(visible_tenants(request)) == 1:
            shown.remove("tenant")  # one tenant: the column says nothing
        return shown

    @admin.display(description="thread")
    def thread_link(self, obj: AuditEvent):
        """The thread's page, and its readable audit timeline."""
        if not obj.thread_id:
            return "-"
        thread = reverse(
            "admin:audit_auditevent_thread", args=[obj.tenant_id, obj.thread_id]
        )
        timeline = reverse(
            "admin:audit_auditevent_timeline", args=[obj.tenant_id, obj.thread_id]
        )
        return format_html(
            '{} <a href="{}" class="audit-timeline-link">timeline</a>',
            short_id(obj.thread_id, thread),
            timeline,
        )

    @admin.display(description="run")
    def run_link(self, obj: AuditEvent):
        if not obj.run_id:
            return "-"
        return short_id(obj.run_id, _url("admin:runs_run_change", obj.run_id))

    @admin.display(description="request")
    def request_link(self, obj: AuditEvent):
        approval_id = (obj.data or {}).get("approval_id")
        if not isinstance(approval_id, str) or not approval_id:
            return "-"
        url = _url("admin:approvals_approvalrequest_change", approval_id)
        return short_id(approval_id, url)

    def get_urls(self):
        wrap = self.admin_site.admin_view
        urls = [
            path(
                "timeline/<int:tenant_id>/<path:thread_id>/",
                wrap(self.timeline_view),
                name="audit_auditevent_timeline",
            ),
            path(
                "thread/<int:tenant_id>/<path:thread_id>/",
                wrap(self.thread_view),
                name="audit_auditevent_thread",
            ),
        ]
        return urls + super().get_urls()

    def thread_view(self, request, tenant_id: int, thread_id: str):
        """From an event to its thread's page (events name a thread by the
        client's id; the page is the thread's row)."""
        if not user_can(request.user, permissions.READ_AUDIT, tenant_id):
            raise PermissionDenied
        thread = Thread.objects.filter(tenant_id=tenant_id, thread_id=thread_id).first()
        if thread is None:
            raise Http404("That thread is gone (deleted): its audit events remain.")
        return HttpResponseRedirect(
            reverse("admin:runs_thread_change", args=[thread.pk])
        )

    def timeline_view(self, request, tenant_id: int, thread_id: str):
        if not user_can(request.user, permissions.READ_AUDIT, tenant_id):
            raise PermissionDenied
        tenant = get_object_or_404(Tenant, pk=tenant_id)
        # The reader's zone (runs.timezones), unless they ask for another.
        try:
            tz = selectors.zone(
                request.GET.get("tz") or timezone.get_current_timezone_name()
            )
        except ValueError:
            tz = selectors.UTC
        timeline = selectors.thread_timeline(tenant=tenant, thread_id=thread_id)
        if timeline is None:
            raise Http404("No audit events for that thread.")
        thread = Thread.objects.filter(tenant=tenant, thread_id=thread_id).first()
        query = urlencode({"tenant": tenant.pk, "thread_id": thread_id})
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": f"Timeline of thread {thread_id}",
            "tenant": tenant,
            "timeline": timeline,
            "rows": [
                (
                    entry.at.astimezone(tz).strftime("%Y-%m-%d %H:%M:%S %Z"),
                    entry,
                    _url("admin:runs_run_change", entry.run_id) if entry.run_id else "",
                    _url("admin:approvals_approvalrequest_change", entry.approval_id)
                    if entry.approval_id
                    else "",
                )
                for entry in timeline.entries
            ],
            "tz": str(tz),
            "events_url": reverse("admin:audit_auditevent_changelist") + "?" + query,
            "thread_url": (
                reverse("admin:runs_thread_change", args=[thread.pk]) if thread else ""
            ),
            "requests_url": _url("admin:approvals_approvalrequest_changelist")
            + "?"
            + urlencode({"q": thread_id}),
        }
        return TemplateResponse(request, "admin/audit/timeline.html", context)

    def lookup_allowed(self, lookup, value, request=None):
        # The timeline page links back here with ?thread_id=.
        return lookup == "thread_id" or super().lookup_allowed(lookup, value, request)

    def changelist_view(self, request, extra_context=None):
        extra_context = {
            **(extra_context or {}),
            "verifications": latest_verifications(request),
        }
        return super().changelist_view(request, extra_context)


@admin.register(AuditBlock)
class AuditBlockAdmin(ReadOnlyAuditAdmin):
    list_display = [
        "tenant",
        "first_seq",
        "last_seq",
        "event_count",
        "short_hash",
        "sealed_at",
    ]
    list_filter = [TenantFilter]
    list_select_related = ["tenant"]
    ordering = ["-sealed_at"]
    exclude = ["leaves"]
    readonly_fields = [
        "tenant",
        "first_seq",
        "last_seq",
        "events_hash",
        "prev_hash",
        "block_hash",
        "sealed_at",
    ]

    @admin.display(description="block hash")
    def short_hash(self, obj: AuditBlock) -> str:
        return obj.block_hash[:16] + "…"


@admin.register(AuditVerification)
class AuditVerificationAdmin(ReadOnlyAuditAdmin):
    list_display = [
        "tenant",
        "checked_at",
        "ok",
        "blocks",
        "events",
        "unsealed",
        "first_bad_seq",
        "problem",
        "checked_by",
        "signed",
    ]
    list_filter = [TenantFilter, "ok"]
    list_select_related = ["tenant"]
    ordering = ["-checked_at"]
    change_list_template = "admin/audit/auditverification/change_list.html"
    readonly_fields = [
        "tenant",
        "checked_at",
        "ok",
        "blocks",
        "events",
        "unsealed",
        "first_bad_seq",
        "problem",
        "head_seq",
        "head_hash",
        "checked_by",
        "against_seq",
        "against_hash",
        "signed",
    ]

    @admin.display(boolean=True, description="signed by Gatehouse")
    def signed(self, obj: AuditVerification) -> bool:
        return anchors.verification_is_signed(obj)

    def get_urls(self):
        urls = [
            path(
                "verify-now/",
                self.admin_site.admin_view(require_POST(self.verify_now_view)),
                name="audit_auditverification_verify_now",
            )
        ]
        return urls + super().get_urls()

    def verify_now_view(self, request):
        """Recompute the chains of the tenants the user sees, now."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        broken = []
        tenants = list(visible_tenants(request))
        for tenant in tenants:
            result = services.audit_verify(
                tenant=tenant, checked_by=request.user.get_username()
            )
            if not result.ok:
                broken.append(f"{tenant.slug} at #{result.first_bad_seq}")
        if broken:
            self.message_user(
                request, "Broken chain: " + "; ".join(broken), messages.ERROR
            )
        else:
            self.message_user(
                request, f"{len(tenants)} chain(s) verified: all intact.", messages.INFO
            )
        return HttpResponseRedirect(reverse("admin:audit_auditverification_changelist"))
