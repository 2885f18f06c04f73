"""Threads and runs in the admin: read-only, tenant-scoped.

A thread's page shows its status, agent and version, pending approvals and a
timeline of its checkpoints and runs, all structure; the decrypted state of a
checkpoint is shown only on request, to roles allowed to read content, and
every such read is an audit event (`runs.services.thread_state`).

`runs` does not import `approvals`: pending approvals are reached through the
reverse relation `approval_requests` that approvals declares, and linked by
URL name.
"""

from __future__ import annotations

import json
import logging

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Count, IntegerField, OuterRef, Subquery
from django.http import Http404, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, path, reverse
from django.utils.html import format_html, format_html_join
from django.views.decorators.http import require_POST

from audit.services import Actor
from runs import permissions
from runs.admin_scoping import (
    ReadOnlyScopedAdmin,
    ScopedTenantFilter,
    user_can,
)
from runs.crypto import CryptoError, ThreadDeleted
from runs.errors import InvalidRequest, StateConflict, VersionSkew
from runs.models import Checkpoint, Run, Thread
from runs.selectors import state_body
from runs.services import run_retry, thread_close, thread_state

logger = logging.getLogger(__name__)

THREAD_TEMPLATE = "admin/runs/thread/detail.html"
TIMELINE_ENTRIES = 200


class ThreadsAdmin(ReadOnlyScopedAdmin):
    view_capability = permissions.VIEW_THREADS


def _pending_approvals_count():
    approvals = Thread._meta.get_field("approval_requests").related_model
    return Subquery(
        approvals.objects.filter(thread=OuterRef("pk"), status="pending")
        .order_by()
        .values("thread")
        .annotate(count=Count("pk"))
        .values("count"),
        output_field=IntegerField(),
    )


def _approval_url(approval_pk) -> str:
    try:
        return reverse("admin:approvals_approvalrequest_change", args=[approval_pk])
    except NoReverseMatch:
        return ""


def _timeline_url(user, thread) -> str:
    """The thread's audit timeline, for the roles that read the audit trail."""
    if not user_can(user, permissions.READ_AUDIT, thread.tenant_id):
        return ""
    return reverse(
        "admin:audit_auditevent_timeline", args=[thread.tenant_id, thread.thread_id]
    )


@admin.register(Thread)
class ThreadAdmin(ThreadsAdmin):
    list_display = [
        "thread_id",
        "tenant",
        "agent_name",
        "agent_version",
        "status",
        "pending_approvals",
        "updated_at",
        "created_at",
    ]
    list_filter = [
        "status",
        ScopedTenantFilter,
        ("deleted_at", admin.EmptyFieldListFilter),
    ]
    search_fields = ["=thread_id"]
    search_help_text = "An exact thread id."
    list_select_related = ["tenant"]
    ordering = ["-updated_at"]
    show_full_result_count = False

    def get_queryset(self, request):
        return (
            super()
            .get_queryset(request)
            .annotate(pending_count=_pending_approvals_count())
        )

    @admin.display(description="pending approvals", ordering="pending_count")
    def pending_approvals(self, obj):
        return obj.pending_count or 0

    def change_view(self, request, object_id, form_url="", extra_context=None):
        if request.method != "GET":
            return HttpResponseNotAllowed(["GET"])
        thread = self.get_object(request, object_id)
        if thread is None:
            raise Http404("no such thread")
        if not self.has_view_permission(request, thread):
            raise PermissionDenied
        # Tenant admins see the structure; decrypted content (state, interrupt
        # values) only the roles that read content (runs.permissions).
        can_read_state = user_can(
            request.user, permissions.READ_STATE, thread.tenant_id
        )
        chosen = request.GET.get("checkpoint", "")
        state, state_error = None, ""
        if chosen:
            if not can_read_state:
                raise PermissionDenied
            state, state_error = self._state(request, thread, chosen)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": f"Thread {thread.thread_id}",
            "thread": thread,
            "approvals": self._approvals(thread),
            "timeline_url": _timeline_url(request.user, thread),
            "timeline": self._timeline(thread),
            "can_read_state": can_read_state,
            "chosen": chosen,
            "state": state,
            "state_error": state_error,
            "can_recover": thread.status == Thread.Status.ERROR
            and user_can(request.user, permissions.RECOVER_RUNS, thread.tenant_id),
        }
        return TemplateResponse(request, THREAD_TEMPLATE, context)

    # --- A failed thread: run it again, or close it (compliance officers) -----------

    def get_urls(self):
        wrap = self.admin_site.admin_view
        return [
            path(
                "<int:object_id>/retry/",
                wrap(require_POST(self.retry_view)),
                name="runs_thread_retry",
            ),
            path(
                "<int:object_id>/close/",
                wrap(require_POST(self.close_view)),
                name="runs_thread_close",
            ),
        ] + super().get_urls()

    def _recoverable(self, request, object_id) -> Thread:
        thread = self.get_object(request, str(object_id))
        if thread is None:
            raise Http404("no such thread")
        if not user_can(request.user, permissions.RECOVER_RUNS, thread.tenant_id):
            raise PermissionDenied
        return thread

    def _back(self, thread) -> HttpResponseRedirect:
        return HttpResponseRedirect(
            reverse("admin:runs_thread_change", args=[thread.pk])
        )

    def retry_view(self, request, object_id):
        thread = self._recoverable(request, object_id)
        try:
            run = run_retry(thread=thread, actor=Actor.user(request.user))
        except StateConflict as exc:
            messages.error(request, str(exc.detail))
        else:
            messages.success(
                request,
                f"Run {run.id} queued: it continues from the latest checkpoint, "
                "the failed step first.",
            )
        return self._back(thread)

    def close_view(self, request, object_id):
        thread = self._recoverable(request, object_id)
        try:
            thread_close(
                thread=thread,
                actor=Actor.user(request.user),
                note=request.POST.get("note", ""),
            )
        except InvalidRequest:
            messages.error(request, "Closing a failed thread needs a note: why.")
        except StateConflict as exc:
            messages.error(request, str(exc.detail))
        else:
            messages.success(
                request, "Thread closed; its open approval requests were closed."
            )
        return self._back(thread)

    @staticmethod
    def _state(request, thread, checkpoint_id):
        checkpoint_id = "" if checkpoint_id == "latest" else checkpoint_id
        try:
            snapshot = thread_state(
                thread=thread,
                actor=Actor.user(request.user),
                checkpoint_id=checkpoint_id or None,
            )
        except ThreadDeleted:
            return None, "The thread was deleted: its content is gone."
        except CryptoError as exc:
            logger.error("state of thread %s unreadable: %s", thread.pk, exc)
            return None, (
                f"The state is unreadable ({type(exc).__name__}): what is stored "
                "failed authentication (altered, or copied from another thread)."
            )
        except (InvalidRequest, VersionSkew) as exc:
            detail = exc.detail
            if isinstance(detail, dict):
                detail = " ".join(str(m) for ms in detail.values() for m in ms)
            return None, str(detail)
        if snapshot is None:
            return None, "The thread has no checkpoint yet."
        body = state_body(snapshot)
        body["created_at"] = str(body["created_at"])
        return json.dumps(body, indent=2, ensure_ascii=False, default=str), ""

    @staticmethod
    def _approvals(thread):
        """The thread's approval requests, newest first, with their decisions
        (who, what) as plain labels: nothing here is decrypted."""
        rows = (
            thread.approval_requests.order_by("-created_at")
            .select_related("run")
            .prefetch_related("decisions")[:TIMELINE_ENTRIES]
        )
        return [
            {
                "action": row.action,
                "risk": row.risk,
                "status": row.status,
                "created_at": row.created_at,
                "due_at": row.due_at if row.status == "pending" else None,
                "decided_at": row.decided_at,
                "decisions": [
                    {
                        "reviewer": decision.reviewer_shown,
                        "verdict": decision.verdict,
                        "at": decision.created_at,
                    }
                    for decision in row.decisions.all()
                ],
                "url": _approval_url(row.pk),
                "run_url": reverse("admin:runs_run_change", args=[row.run_id]),
            }
            for row in rows
        ]

    @staticmethod
    def _timeline(thread):
        checkpoints = (
            Checkpoint.objects.filter(thread=thread, checkpoint_ns="")
            .order_by("-created_at")
            .values("checkpoint_id", "step", "source", "run_id", "created_at")[
                :TIMELINE_ENTRIES
            ]
        )
        runs = (
            Run.objects.filter(thread=thread)
            .order_by("-created_at")
            .only(
                "id",
                "kind",
                "status",
                "attempts",
                "error_type",
                "created_at",
                "started_at",
                "ended_at",
            )[:TIMELINE_ENTRIES]
        )
        entries = [
            {"type": "checkpoint", "at": c["created_at"], **c} for c in checkpoints
        ]
        entries += [
            {
                "type": "run",
                "at": run.created_at,
                "run": run,
                "url": reverse("admin:runs_run_change", args=[run.pk]),
            }
            for run in runs
        ]
        entries.sort(key=lambda entry: entry["at"], reverse=True)
        return entries[:TIMELINE_ENTRIES]


@admin.register(Run)
class RunAdmin(ThreadsAdmin):
    list_display = [
        "id",
        "thread_link",
        "tenant",
        "kind",
        "status",
        "agent_version",
        "attempts",
        "created_at",
        "started_at",
        "ended_at",
        "error_type",
        "compensation",
    ]
    list_filter = ["status", "kind", ScopedTenantFilter]
    search_fields = ["=thread__thread_id"]
    search_help_text = "An exact thread id."
    list_select_related = ["tenant", "thread"]
    ordering = ["-created_at"]
    show_full_result_count = False
    fields = [
        "id",
        "thread_link",
        "tenant",
        "kind",
        "status",
        "agent_version",
        "checkpoint_id",
        "requested_by",
        "attempts",
        "lease_owner",
        "lease_until",
        "heartbeat_at",
        "error_type",
        "compensation",
        "next_nodes",
        "created_at",
        "started_at",
        "ended_at",
        "approval_links",
        "audit_link",
    ]
    readonly_fields = fields

    def get_fields(self, request, obj=None):
        fields = list(super().get_fields(request, obj))
        if obj is None or not user_can(
            request.user, permissions.READ_AUDIT, obj.tenant_id
        ):
            fields.remove("audit_link")  # the timeline is for who reads the trail
        return fields

    @admin.display(description="thread", ordering="thread__thread_id")
    def thread_link(self, obj):
        url = reverse("admin:runs_thread_change", args=[obj.thread_id])
        return format_html('<a href="{}">{}</a>', url, obj.thread.thread_id)

    @admin.display(description="approval requests it opened")
    def approval_links(self, obj):
        rows = obj.approval_requests.order_by("created_at")
        links = [
            format_html(
                '<a href="{}">{} ({})</a>',
                _approval_url(row.pk),
                row.action,
                row.status,
            )
            for row in rows
        ]
        return (
            format_html_join(", ", "{}", ((link,) for link in links)) if links else "-"
        )

    @admin.display(description="audit")
    def audit_link(self, obj):
        url = reverse(
            "admin:audit_auditevent_timeline",
            args=[obj.tenant_id, obj.thread.thread_id],
        )
        return format_html('<a href="{}">the thread\'s audit timeline</a>', url)
