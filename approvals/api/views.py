"""The approvals API (api.md): list, detail, decision."""

from __future__ import annotations

import uuid

from django.db import transaction
from django.http import Http404
from django_filters.constants import EMPTY_VALUES
from django_filters.rest_framework import DjangoFilterBackend
from django_filters.utils import translate_validation
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import generics
from rest_framework.response import Response
from rest_framework.views import APIView

from approvals.api.filters import ApprovalFilter
from approvals.api.serializers import (
    ApprovalSerializer,
    ApprovalSummarySerializer,
    DecideSerializer,
    DecisionResultSerializer,
)
from approvals.models import ApprovalRequest
from approvals.selectors import approval_view, decisions_query
from approvals.services import Reviewer, approval_decide, approval_read
from runs import permissions
from runs.api.idempotency import IdempotentWrites, shows_thread_content
from runs.api.serializers import ErrorSerializer, represent
from runs.api.views import actor_for, validated
from runs.fixed_queries import FixedQuery, together
from runs.models import Scope


def _live_requests(tenant):
    # A deleted thread's requests went with it: their payloads are unreadable,
    # and like the thread itself they answer 404.
    return (
        ApprovalRequest.objects.for_tenant(tenant)
        .filter(thread__deleted_at__isnull=True)
        .select_related("thread", "thread__tenant")
    )


def _tenant_requests(request):
    return _live_requests(request.principal.tenant)


# The decision's read of the request: found and locked in one statement with
# its thread, their rows alone, the request's first (the lock order of
# approvals.services.lifecycle: Postgres locks a row's marks in the order
# `of` names them), with its tenant; a locked row is read as it is once
# locked, so the thread is current. Only while pending: a request no longer
# pending is refused without waiting for its thread, whose holder (a worker
# re-opening the request, a migration moving it) may be waiting for the
# request's row. Compiled once per process (runs.fixed_queries); the
# arguments are the tenant's pk and the request's id.
_LOCKED_REQUEST = FixedQuery(
    lambda tenant_pk, approval_id: (
        _live_requests(tenant_pk)
        .select_related("tenant")
        .select_for_update(of=("self", "thread"), no_key=True)
        .filter(pk=approval_id, status=ApprovalRequest.Status.PENDING)
        .order_by()
    ),
    -1,
    uuid.UUID("5a3b1e00-0000-4000-8000-0000000a9901"),
)


def _render(
    approval: ApprovalRequest,
    serializer_class=ApprovalSerializer,
    *,
    shown=None,
    **extra,
):
    """The request as `serializer_class` shows it; `shown`: its
    approval_view (the payload and decisions decrypted), if already made."""
    if shown is None:
        shown = approval_view(approval)
    data = {
        **{
            field: getattr(shown, field)
            for field in (
                "id",
                "thread",
                "run_id",
                "interrupt_id",
                "status",
                "gate",
                "risk",
                "payload",
                "args",
                "edits",
                "required_approvals",
                "created_at",
                "due_at",
                "escalation_level",
            )
        },
        "decisions": shown.decisions_shown,
        **extra,
    }
    return represent(serializer_class, data)


# What ApprovalSummarySerializer shows of a request, by column: each field's
# source as the ORM spells it (thread.thread_id: thread__thread_id).
_SUMMARY_COLUMNS = tuple(
    field.source.replace(".", "__")
    for field in ApprovalSummarySerializer().fields.values()
)


def _summaries(tenant):
    # The summary's columns and the thread's id, not every column of the
    # request, its thread and their tenant (14 where there were 41, the
    # payloads among them): a third of the query to compile, and rows made of
    # what the page shows.
    return (
        ApprovalRequest.objects.for_tenant(tenant)
        .filter(thread__deleted_at__isnull=True)
        .select_related("thread")
        .only(*_SUMMARY_COLUMNS)
    )


def _summary_page(tenant, filters, values, ordering, limit):
    """The list's first page as the ORM builds it: the tenant's live requests,
    each filter of ApprovalFilter applied with its value (django-filter's
    own `filter`), in the paginator's order, `limit` rows."""
    queryset = _summaries(tenant)
    for filter_, value in zip(filters, values, strict=True):
        queryset = filter_.filter(queryset, value)
    return queryset.order_by(*ordering)[:limit]


# The list's first pages of the default size by shape (the filters given, the
# order): each compiled once per process (runs.fixed_queries). Building and
# compiling the query was a third of the request's CPU (find-approval in
# bench/decision_probe.py). At most 16 shapes (the filters given of four, the
# paginator's one order), so a client cannot grow it: a page of another
# size (`limit`) is built by the ORM each time, as before (a key with the
# size let any number of `limit`s each compile and keep a query).
_FIRST_PAGES: dict[tuple, FixedQuery] = {}


class _FirstPage:
    """The list's queryset as CursorPagination.paginate_queryset uses it on a
    page without a cursor: ordered (`order_by`), then sliced once from the
    start and read. The same query as the ORM's queryset (_summary_page),
    its SQL compiled once per shape; a page with a cursor (a filter on the
    position) is the ORM's."""

    def __init__(
        self, tenant_pk: int, filters: dict, given: dict, compiled_rows: int
    ) -> None:
        self.tenant_pk = tenant_pk
        self.compiled_rows = compiled_rows
        self.names = tuple(given)
        self.filters = tuple(filters[name] for name in self.names)
        self.values = tuple(given.values())
        self.ordering: tuple[str, ...] = ()

    @classmethod
    def of(
        cls, tenant_pk: int, filterset: ApprovalFilter, compiled_rows: int
    ) -> _FirstPage | None:
        """The first page of a valid filterset's filters, its query compiled
        when it reads `compiled_rows` rows (the default page's); None where a value
        is not a plain string as the compiled query's parameter of its filter
        is (a choice filter's null value is a filter on NULL: another shape
        of query)."""
        given = {
            name: value
            for name, value in filterset.form.cleaned_data.items()
            if value not in EMPTY_VALUES
        }
        for name, value in given.items():
            if type(value) is not str or value == getattr(
                filterset.filters[name], "null_value", None
            ):
                return None
        return cls(tenant_pk, filterset.filters, given, compiled_rows)

    def order_by(self, *ordering: str) -> _FirstPage:
        self.ordering = ordering
        return self

    def __getitem__(self, rows: slice) -> list[ApprovalRequest]:
        if rows.start not in (0, None) or rows.step is not None or rows.stop is None:
            raise TypeError("only a first page is read from here")
        if rows.stop != self.compiled_rows:  # another page size: the ORM's
            return list(
                _summary_page(
                    self.tenant_pk, self.filters, self.values, self.ordering, rows.stop
                )
            )
        key = (self.names, self.ordering)
        query = _FIRST_PAGES.get(key)
        if query is None:
            filters, ordering, limit = self.filters, self.ordering, rows.stop
            query = _FIRST_PAGES.setdefault(
                key,
                FixedQuery(
                    lambda tenant_pk, *values: _summary_page(
                        tenant_pk, filters, values, ordering, limit
                    ),
                    -1,
                    # Samples no request sends (a value with a NUL is never
                    # a choice; no thread_id holds one).
                    *(f"\x00sample {name}" for name in self.names),
                ),
            )
        return query(self.tenant_pk, *self.values)


class ApprovalListView(generics.ListAPIView):
    required_scope = Scope.APPROVALS
    serializer_class = ApprovalSummarySerializer

    # Named here, not taken from the settings: the list's first page applies
    # these filters itself (_FirstPage), and only these.
    filter_backends = [DjangoFilterBackend]
    filterset_class = ApprovalFilter

    @extend_schema(summary="Approval requests")
    def get(self, request, *args, **kwargs):
        return super().get(request, *args, **kwargs)

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation
            return ApprovalRequest.objects.none()
        return _summaries(self.request.principal.tenant)

    def list(self, request, *args, **kwargs):
        # ListModelMixin.list with the page rendered by a shared serializer
        # (runs.api.serializers.represent); the list is always paginated.
        rows = None
        if self.paginator.cursor_query_param not in request.query_params:
            # DjangoFilterBackend.filter_queryset's validation, the same 400;
            # the filters are applied by the first page's compiled query.
            filterset = ApprovalFilter(
                request.query_params,
                queryset=ApprovalRequest.objects.none(),
                request=request,
            )
            if not filterset.is_valid():
                raise translate_validation(filterset.errors)
            # CursorPagination reads a page and one row more, to know of a next.
            rows = _FirstPage.of(
                request.principal.tenant.pk,
                filterset,
                compiled_rows=self.paginator.page_size + 1,
            )
        if rows is None:
            rows = self.filter_queryset(self.get_queryset())
        page = self.paginate_queryset(rows)
        return self.get_paginated_response(
            represent(ApprovalSummarySerializer, page, many=True)
        )


class ApprovalDetailView(APIView):
    required_scope = Scope.APPROVALS

    @extend_schema(responses=ApprovalSerializer, summary="An approval request")
    def get(self, request, approval_id):
        approval = generics.get_object_or_404(_tenant_requests(request), pk=approval_id)
        body = _render(approval)
        approval_read(approval=approval, actor=actor_for(request), how="detail")
        return Response(body)


class ApprovalDecisionView(IdempotentWrites, APIView):
    required_scope = Scope.APPROVALS
    required_capability = permissions.DECIDE

    @extend_schema(
        request=DecideSerializer,
        responses={
            200: DecisionResultSerializer,
            400: OpenApiResponse(
                ErrorSerializer,
                description="`invalid`: a denial or an edit without a note, or "
                "edited `args` that break the action's declared schema "
                "(`fields.args` names each argument); on a plan gate, a `plan` "
                "change that does (`fields.plan.args.<step>.<argument>`) or that "
                "removes steps the plan lacks, or every step "
                "(`fields.plan.remove`).",
            ),
            409: OpenApiResponse(
                ErrorSerializer,
                description="`already_decided`; `same_reviewer` (this person, or "
                "a service key, already approved these arguments); "
                "`idempotency_key_reused`, `idempotency_in_progress`.",
            ),
        },
        summary="Decide an approval request (resumes the run once settled)",
        description="Approvals are counted by authenticated principal: a "
        "session or a personal key decides as its user; a service key as itself, "
        "whatever `reviewer` label it sends (recorded as its unverified label), "
        "and all service keys together count as one approval. Honours "
        "Idempotency-Key.",
    )
    def post(self, request, approval_id):
        # One transaction: the request and its thread found and locked in one
        # read, the decision, and the read of the answer that shows the
        # payload and the decisions (a read like the detail's, besides the
        # decision itself), recorded with the decision, in its statement.
        with transaction.atomic():
            # The request's decisions read with the lock, in one round trip,
            # once it is taken (used only if the request is found pending).
            found, decisions = together(
                (_LOCKED_REQUEST, (request.principal.tenant.pk, approval_id)),
                decisions_query(approval_id),
            )
            locked = bool(found)
            if not locked:
                # Not pending (or not there): approval_decide locks the row
                # alone and answers 409 `already_decided`.
                found = _tenant_requests(request).filter(pk=approval_id)[:1]
                if not found:
                    raise Http404
            approval = found[0]
            body = validated(DecideSerializer, request)
            # A person decides as themselves; a service key as the key,
            # whatever name it sends (kept as its unverified label).
            reviewer = Reviewer.for_principal(
                request.principal, claimed_label=body["reviewer"]
            )
            approval, run = approval_decide(
                approval=approval,
                already_locked=locked,
                decisions=decisions,
                read_by=actor_for(request),
                reviewer=reviewer,
                approved=body["approved"],
                note=body["note"],
                args=body.get("args"),
                plan=body.get("plan"),
            )
            # Decrypted before the commit: what can fail in the answer (a
            # key, a ciphertext) fails the decision with it, never a 500
            # for a decision that was recorded, with its read, unseen.
            shown = approval_view(approval, approval.decisions_now)
        # The rest of the answer is made once the transaction committed (and
        # sent the resumed run's task, runs.wakeups), from memory: no row
        # read again, so nothing it shows could have changed; made first, it
        # held the task back from its worker. With an Idempotency-Key the
        # commit is the wrapper's, after this.
        resumed = {"run_id": run.id, "status": run.status} if run else None
        body = _render(
            approval, DecisionResultSerializer, shown=shown, resumed_run=resumed
        )
        # The answer shows the payload and the note: kept for a replay under
        # the thread's key, shredded with the thread.
        shows_thread_content(request, approval.thread)
        return Response(body)

    def idempotent_replayed(self, request, approval_id):
        """A replay of the answer shows the payload again: a read like the
        detail's, audited (`approval.read`, how "replay"). A request whose
        thread was deleted answers 404 before this (runs.api.idempotency)."""
        approval = generics.get_object_or_404(_tenant_requests(request), pk=approval_id)
        approval_read(approval=approval, actor=actor_for(request), how="replay")
