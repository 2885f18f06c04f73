"""The reviewer's desk in the Django admin: the queue, the request page, the
dashboard.

Who may do what is the capabilities of runs.permissions (superusers may do
everything): reviewers and compliance officers decide; compliance officers
also reassign, escalate and see reviewer statistics; auditors read everything
and decide nothing. Every check is made here on the server, whatever the page
shows. The cards are built by `approvals.cards`; deciding calls the same
service as the REST decision (`approvals.services.desk_decide`).
"""

from __future__ import annotations

import uuid

from django.contrib import admin, messages
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.utils import unquote
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.db.models import prefetch_related_objects
from django.http import Http404, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.views.decorators.http import require_POST

from approvals import cards, dashboard, outcome, queue, selectors, services
from approvals.edits import InvalidArgs, value_text
from approvals.forms import AssignForm, DecisionForm, EditedArgsForm, EditedPlanForm
from approvals.models import PENDING_FIRST, ApprovalRequest
from approvals.plans import InvalidPlan
from audit.export import CONTENT_TYPES, ExportResponse
from audit.services import Actor
from runs import permissions
from runs.admin_scoping import (
    ReadOnlyScopedAdmin,
    ScopedTenantFilter,
    tenant_ids_for,
    user_can,
)
from runs.crypto import CryptoError, ThreadCipher, ThreadDeleted
from runs.errors import InvalidRequest, StateConflict

CARD_TEMPLATE = "admin/approvals/approvalrequest/card.html"
DASHBOARD_TEMPLATE = "admin/approvals/approvalrequest/dashboard.html"


def _tenant_ids(request, capability: str):
    if request.user.is_superuser:
        return dashboard.ALL_TENANTS
    return tenant_ids_for(request.user, capability)


class EscalatedFilter(admin.SimpleListFilter):
    title = "escalated"
    parameter_name = "escalated"

    def lookups(self, request, model_admin):
        return [("yes", "Escalated"), ("no", "Not escalated")]

    def queryset(self, request, queryset):
        if self.value() == "yes":
            return queryset.filter(escalation_level__gt=0)
        if self.value() == "no":
            return queryset.filter(escalation_level=0)
        return queryset


class AssignedFilter(admin.SimpleListFilter):
    title = "assigned"
    parameter_name = "assigned"

    def lookups(self, request, model_admin):
        return [("me", "To me"), ("none", "Unassigned")]

    def queryset(self, request, queryset):
        if self.value() == "me":
            return queryset.filter(assignment__assignee=request.user)
        if self.value() == "none":
            return queryset.filter(assignment__isnull=True)
        return queryset


class ReviewerFilter(admin.SimpleListFilter):
    """Requests a person (or a service key) decided; with the decision filter,
    what they decided."""

    title = "decided by"
    parameter_name = "reviewer"

    def lookups(self, request, model_admin):
        tenants = _tenant_ids(request, permissions.VIEW_APPROVALS)
        return queue.reviewer_choices(
            None if tenants is dashboard.ALL_TENANTS else tenants
        )

    def queryset(self, request, queryset):
        return _decided(request, queryset)


class DecisionFilter(admin.SimpleListFilter):
    title = "decision"
    parameter_name = "decision"

    def lookups(self, request, model_admin):
        return [(key, label) for key, (label, _) in queue.VERDICTS.items()] + [
            (queue.UNDECIDED, "No decision yet")
        ]

    def queryset(self, request, queryset):
        return _decided(request, queryset)


def _decided(request, queryset):
    # Both filters apply the one condition, so "decided by rita" and "denied"
    # together mean rita denied (applying it twice changes nothing).
    return queue.filter_decided(
        queryset,
        reviewer=request.GET.get(ReviewerFilter.parameter_name, ""),
        verdict=request.GET.get(DecisionFilter.parameter_name, ""),
    )


class QueueChangeList(ChangeList):
    """Decrypts the payloads of the page's rows only, after they are fetched,
    and reads their decisions in one query."""

    def get_results(self, request):
        super().get_results(request)
        self.result_list = list(self.result_list)
        prefetch_related_objects(self.result_list, "decisions")
        cards.attach_payloads(self.result_list)
        # One read of content for the page, per tenant on it.
        services.approval_payloads_read(
            approvals=[row for row in self.result_list if row.desk_payload],
            actor=Actor.user(request.user),
        )


def _links(user, approval) -> dict[str, str]:
    """Where a request leads: its thread, the run that asked, and (for the
    roles that read the audit trail) the thread's audit timeline."""
    links = {
        "thread_url": reverse("admin:runs_thread_change", args=[approval.thread_id]),
        "run_url": reverse("admin:runs_run_change", args=[approval.run_id]),
        "timeline_url": "",
    }
    if user_can(user, permissions.READ_AUDIT, approval.tenant_id):
        links["timeline_url"] = reverse(
            "admin:audit_auditevent_timeline",
            args=[approval.tenant_id, approval.thread.thread_id],
        )
    return links


def _form_errors(*forms) -> list[str]:
    """Every error of the page's forms, for the top of the page: a reviewer
    must not have to scroll to learn that nothing was decided."""
    return [
        f"{form.fields[name].label or name}: {message}"
        if name != "__all__" and name in form.fields
        else message
        for form in forms
        if form is not None and form.is_bound
        for name, messages_ in form.errors.items()
        for message in messages_
    ]


def _error_text(exc: Exception) -> str:
    detail = getattr(exc, "detail", exc)
    if isinstance(detail, dict):
        return " ".join(str(item) for items in detail.values() for item in items)
    return str(detail)


def _plan_form(card, **kwargs) -> EditedPlanForm:
    """The form that changes the plan a card shows (the steps it still has)."""
    return EditedPlanForm(
        kwargs.pop("data", None),
        steps=card["args"]["steps"],
        editable={
            str(step["step"]): step["editable"] for step in card["plan"]["steps"]
        },
        **kwargs,
    )


@admin.register(ApprovalRequest)
class ApprovalRequestAdmin(ReadOnlyScopedAdmin):
    view_capability = permissions.VIEW_APPROVALS

    list_display = [
        "action",
        "args_line",
        "risk_label",
        "status",
        "escalation",
        "assigned",
        "thread_link",
        "age",
        "decided_by",
        "decided_at_text",
        "tenant",
    ]
    list_display_links = ["action"]
    # Pending first, the soonest due first: the order of index approval_queue.
    ordering = [PENDING_FIRST.asc(), "due_at"]
    list_filter = [
        "status",
        DecisionFilter,
        ReviewerFilter,
        "risk",
        "gate",
        EscalatedFilter,
        AssignedFilter,
        ScopedTenantFilter,
    ]
    # Exact thread ids (a client's case id); actions and the arguments an
    # agent declares safe to show (an order id) by substring.
    search_fields = ["=thread__thread_id", "action", "safe_args"]
    search_help_text = (
        "An exact thread id, part of an action's name, or an argument the agent "
        "shows in clear (an order id, an amount)."
    )
    list_select_related = ["tenant", "thread", "assignment__assignee"]
    list_per_page = 50
    show_full_result_count = False
    # Read-only rows (no bulk decisions: each request is judged on its own
    # page, no delete); deciding has its own checks.

    # --- The queue ---------------------------------------------------------------

    def get_list_display(self, request):
        shown = list(super().get_list_display(request))
        if not request.user.is_superuser:
            tenants = self.seen_in(request.user)
            if len(tenants) == 1:
                shown.remove("tenant")  # one tenant: the column says nothing
        return shown

    def changelist_view(self, request, extra_context=None):
        # The queue is the pending requests; any other list is a record of
        # requests, decided ones among them.
        pending_only = request.GET.get("status__exact") == "pending"
        extra_context = {
            "title": (
                "Queue: requests waiting on a human"
                if pending_only
                else "Approval requests"
            ),
            **(extra_context or {}),
        }
        return super().changelist_view(request, extra_context)

    def export_view(self, request):
        """The list as filtered and searched on the page, as CSV."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        try:
            changelist = self.get_changelist_instance(request)
        except IncorrectLookupParameters:
            return HttpResponseRedirect(
                reverse("admin:approvals_approvalrequest_changelist") + "?e=1"
            )
        response = ExportResponse(
            queue.csv_chunks(changelist.get_queryset(request)),
            content_type=CONTENT_TYPES["csv"],
        )
        stamp = timezone.now().strftime("%Y%m%dT%H%M%SZ")
        response["Content-Disposition"] = (
            f'attachment; filename="approval-requests-{stamp}.csv"'
        )
        return response

    def get_changelist(self, request, **kwargs):
        return QueueChangeList

    @admin.display(description="arguments")
    def args_line(self, obj):
        if obj.desk_payload is None:
            return format_html(
                '<span class="desk-unreadable">{}</span>', obj.desk_unreadable
            )
        return cards.request_summary(obj, obj.desk_payload)

    @admin.display(description="risk", ordering="risk")
    def risk_label(self, obj):
        return format_html(
            '<span class="desk-risk desk-risk-{}">{}</span>', obj.risk, obj.risk
        )

    @admin.display(description="thread", ordering="thread__thread_id")
    def thread_link(self, obj):
        url = reverse("admin:runs_thread_change", args=[obj.thread_id])
        return format_html('<a href="{}">{}</a>', url, obj.thread.thread_id)

    # One column for both times of a request, so that the queue fits a
    # 1400 px screen: how long it waited (until now, or until it was decided)
    # and, while pending, when it escalates.
    @admin.display(description="waiting", ordering="created_at")
    def age(self, obj):
        if not obj.is_pending:
            end = obj.decided_at or timezone.now()
            return cards.duration_text(end - obj.created_at)
        waited = cards.duration_text(timezone.now() - obj.created_at)
        left = obj.due_at - timezone.now()
        if left.total_seconds() < 0:
            return format_html(
                '{}<br><span class="desk-overdue">overdue {}</span>',
                waited,
                cards.duration_text(left),
            )
        return format_html(
            '{}<br><span class="desk-escalates">escalates in {}</span>',
            waited,
            cards.duration_text(left),
        )

    @admin.display(description="level", ordering="escalation_level")
    def escalation(self, obj):
        return obj.escalation_level

    @admin.display(description="assigned to")
    def assigned(self, obj):
        assignment = getattr(obj, "assignment", None)
        return assignment.assignee.get_username() if assignment else "—"

    @admin.display(description="decided by")
    def decided_by(self, obj):
        return queue.deciders_text(obj.decisions.all()) or "—"

    @admin.display(description="decided at", ordering="decided_at")
    def decided_at_text(self, obj):
        if obj.decided_at is None:
            return "—"
        # The date above the time: the column stays narrow.
        day, _, clock = cards.time_text(obj.decided_at).partition(" ")
        return format_html('<span class="desk-nowrap">{}</span><br>{}', day, clock)

    # --- URLs ------------------------------------------------------------------------

    def get_urls(self):
        wrap = self.admin_site.admin_view
        name = "approvals_approvalrequest"
        return [
            path("dashboard/", wrap(self.dashboard_view), name="approvals_dashboard"),
            path(
                "export.csv",
                wrap(self.export_view),
                name="approvals_approvalrequest_export",
            ),
            path(
                "<uuid:object_id>/decide/",
                wrap(require_POST(self.decide_view)),
                name=f"{name}_decide",
            ),
            path(
                "<uuid:object_id>/reassign/",
                wrap(require_POST(self.reassign_view)),
                name=f"{name}_reassign",
            ),
            path(
                "<uuid:object_id>/escalate/",
                wrap(require_POST(self.escalate_view)),
                name=f"{name}_escalate",
            ),
        ] + super().get_urls()

    def _approval_or_404(self, request, object_id) -> ApprovalRequest:
        """The request, if the user's tenants include its tenant: another
        tenant's request answers 404, exactly as one that does not exist."""
        try:
            pk = uuid.UUID(str(unquote(str(object_id))))
        except ValueError:
            raise Http404("no such approval request") from None
        approval = (
            self.get_queryset(request)
            .select_related("tenant", "thread")
            .filter(pk=pk)
            .first()
        )
        if approval is None:
            raise Http404("no such approval request")
        if not self.has_view_permission(request, approval):
            raise PermissionDenied
        return approval

    def _card_url(self, approval) -> str:
        return reverse("admin:approvals_approvalrequest_change", args=[approval.pk])

    # --- The request page -------------------------------------------------------------

    def change_view(self, request, object_id, form_url="", extra_context=None):
        if request.method != "GET":
            return HttpResponseNotAllowed(["GET"])
        approval = self._approval_or_404(request, object_id)
        try:
            card = cards.card_fields(approval=approval, user=request.user)
        except CryptoError as exc:
            return self._render_unreadable(request, approval, exc)
        opening = None
        if approval.is_pending and user_can(
            request.user, permissions.DECIDE, approval.tenant_id
        ):
            opening = services.opening_record(
                approval=approval, user=request.user, card=card
            )
        return self._render_card(request, approval, card, opening)

    def _render_card(
        self,
        request,
        approval,
        card,
        opening,
        *,
        decision_form=None,
        edit_form=None,
        plan_form=None,
        error: str = "",
        status: int = 200,
    ):
        user = request.user
        # Every page that shows a card is one read of the request's content.
        services.approval_read(
            approval=approval,
            actor=Actor.user(user),
            how="card",
            checkpoint_id=card.get("context", {}).get("checkpoint_id", ""),
        )
        already_approved = f"user:{user.pk}" in card.get("approved_by", [])
        # A reviewer whose approval counts already waits for a second one:
        # they are not offered Approve again (the service refuses it anyway).
        deciding = opening is not None and approval.is_pending and not already_approved
        if deciding:
            initial = {"opening": opening.pk}
            decision_form = decision_form or DecisionForm(initial=initial)
            edit_form = edit_form or EditedArgsForm(
                original=card["args"],
                editable=card.get("editable", []),
                initial=initial,
            )
            if card.get("plan"):
                plan_form = plan_form or _plan_form(card, initial=initial)
        managing = approval.is_pending and user_can(
            user, permissions.MANAGE_QUEUE, approval.tenant_id
        )
        edits = {edit["arg"]: edit for edit in card.get("edits", [])}
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": f"{card['action']} on {card['thread_id']}",
            "approval": approval,
            "card": card,
            "args_rows": [
                (key, value_text(value), edits.get(key))
                for key, value in card["args"].items()
            ],
            "can_edit": bool(card.get("editable")),
            "opening": opening,
            "card_hash": cards.card_hash(card),
            "deciding": deciding,
            "decision_form": decision_form,
            "edit_form": edit_form,
            "plan_form": plan_form,
            "error": error,
            "form_errors": _form_errors(decision_form, edit_form),
            "already_approved": already_approved and approval.is_pending,
            "first_approver": next(
                (d for d in card["decisions"] if d.get("counts", d["approved"])),
                None,
            ),
            "managing": managing,
            "assign_form": (
                AssignForm(choices=selectors.decider_choices(approval.tenant_id))
                if managing
                else None
            ),
            "decided": cards.decisions_with_cards(approval),
            "aftermath": outcome.aftermath(approval=approval, user=user),
            "changelist_url": reverse("admin:approvals_approvalrequest_changelist"),
            **_links(user, approval),
        }
        return TemplateResponse(request, CARD_TEMPLATE, context, status=status)

    def _render_unreadable(self, request, approval, exc: CryptoError):
        """A request whose content cannot be decrypted: said plainly, and no
        way to decide it blind."""
        if isinstance(exc, ThreadDeleted):
            reason = "The thread was deleted: this request's content is gone."
        else:
            reason = f"This request's content cannot be read ({exc})."
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": f"{approval.action} on {approval.thread.thread_id}",
            "approval": approval,
            "card": None,
            "unreadable": reason,
            "changelist_url": reverse("admin:approvals_approvalrequest_changelist"),
        }
        return TemplateResponse(request, CARD_TEMPLATE, context)

    def decide_view(self, request, object_id):
        approval = self._approval_or_404(request, object_id)
        if not user_can(request.user, permissions.DECIDE, approval.tenant_id):
            raise PermissionDenied
        try:
            opening_id = uuid.UUID(request.POST.get("opening", ""))
        except ValueError:
            opening_id = None
        opening = selectors.opening_for(
            approval=approval, user=request.user, opening_id=opening_id
        )
        if opening is None:
            messages.error(
                request,
                "That page was out of date or not yours: here is the request as it "
                "is now; decide again.",
            )
            return HttpResponseRedirect(self._card_url(approval))
        try:
            card = cards.opening_card(opening, ThreadCipher.for_thread(approval.thread))
        except CryptoError as exc:
            return self._render_unreadable(request, approval, exc)
        kind = request.POST.get("form")
        if kind == "plan" and card.get("plan"):
            form = _plan_form(card, data=request.POST)
            forms = {"plan_form": form}
        elif kind == "edit":
            form = EditedArgsForm(
                request.POST, original=card["args"], editable=card.get("editable", [])
            )
            forms = {"edit_form": form}
        else:
            form = DecisionForm(request.POST)
            forms = {"decision_form": form}
        editing = not isinstance(form, DecisionForm)
        if not form.is_valid():
            return self._render_card(
                request, approval, card, opening, status=400, **forms
            )
        try:
            approval, run, _ = services.desk_decide(
                approval=approval,
                user=request.user,
                opening=opening,
                approved=True if editing else form.approved,
                note=form.cleaned_data["note"],
                args=form.cleaned_data.get("args") if editing else None,
                plan=form.cleaned_data.get("plan") if editing else None,
            )
        except InvalidArgs as exc:
            form.add_args_errors(exc.errors)
            return self._render_card(
                request, approval, card, opening, status=400, **forms
            )
        except InvalidPlan as exc:
            form.add_plan_errors(exc.errors)
            return self._render_card(
                request, approval, card, opening, status=400, **forms
            )
        except services.RequestChanged as exc:
            # Shown the request as it is now, on a new page: the old one is
            # not what an approval would approve.
            messages.error(request, _error_text(exc))
            return HttpResponseRedirect(self._card_url(approval))
        except (InvalidRequest, StateConflict) as exc:
            status = 409 if isinstance(exc, StateConflict) else 400
            return self._render_card(
                request,
                approval,
                card,
                opening,
                error=_error_text(exc),
                status=status,
                **forms,
            )
        messages.success(request, self._outcome(approval, run))
        return HttpResponseRedirect(self._card_url(approval))

    @staticmethod
    def _outcome(approval, run) -> str:
        resumed = f" The run resumes (run {run.id})." if run else ""
        if approval.status == ApprovalRequest.Status.APPROVED:
            return f"Approved.{resumed}"
        if approval.status == ApprovalRequest.Status.DENIED:
            return f"Denied.{resumed}"
        return (
            f"Your approval is recorded. This {approval.risk}-risk request needs "
            f"{approval.required_approvals} approvals from different people: a "
            "second, different reviewer must approve before the run resumes."
        )

    def reassign_view(self, request, object_id):
        approval = self._approval_or_404(request, object_id)
        if not user_can(request.user, permissions.MANAGE_QUEUE, approval.tenant_id):
            raise PermissionDenied
        form = AssignForm(
            request.POST, choices=selectors.decider_choices(approval.tenant_id)
        )
        if not form.is_valid():
            messages.error(request, "Choose a reviewer of this request's tenant.")
            return HttpResponseRedirect(self._card_url(approval))
        try:
            services.request_reassign(
                approval=approval,
                assignee=form.cleaned_data["assignee"],
                user=request.user,
            )
        except (InvalidRequest, StateConflict) as exc:
            messages.error(request, _error_text(exc))
        else:
            messages.success(
                request,
                f"Assigned to {form.cleaned_data['assignee'].get_username()}.",
            )
        return HttpResponseRedirect(self._card_url(approval))

    def escalate_view(self, request, object_id):
        approval = self._approval_or_404(request, object_id)
        if not user_can(request.user, permissions.MANAGE_QUEUE, approval.tenant_id):
            raise PermissionDenied
        try:
            approval = services.request_escalate(approval=approval, user=request.user)
        except StateConflict as exc:
            messages.error(request, _error_text(exc))
        else:
            messages.success(
                request, f"Escalated to level {approval.escalation_level}."
            )
        return HttpResponseRedirect(self._card_url(approval))

    # --- Waiting on a human ------------------------------------------------------------

    def dashboard_view(self, request):
        if not self.has_module_permission(request):
            raise PermissionDenied
        now = timezone.now()
        tenant_ids = _tenant_ids(request, permissions.VIEW_APPROVALS)
        stats_ids = _tenant_ids(request, permissions.REVIEW_STATS)
        rows = dashboard.pending_by_tenant(tenant_ids, now)
        show_stats = stats_ids is dashboard.ALL_TENANTS or bool(stats_ids)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": "Waiting on a human",
            "tenants": rows,
            "totals": dashboard.totals(rows),
            "oldest": dashboard.oldest_waiting(tenant_ids, now),
            "show_stats": show_stats,
            "reviewers": dashboard.reviewer_stats(stats_ids, now) if show_stats else [],
            "stats_days": dashboard.STATS_DAYS,
            "changelist_url": reverse("admin:approvals_approvalrequest_changelist"),
        }
        return TemplateResponse(request, DASHBOARD_TEMPLATE, context)
