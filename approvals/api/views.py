"""The approvals API (api.md): list, detail, decision."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics
from rest_framework.response import Response
from rest_framework.views import APIView

from approvals.api.serializers import (
    ApprovalSerializer,
    ApprovalSummarySerializer,
    DecideSerializer,
    DecisionResultSerializer,
)
from approvals.models import ApprovalRequest, Gate, Risk
from approvals.selectors import approval_view
from approvals.services import Reviewer, approval_decide, approval_read
from runs.api.views import actor_for
from runs.errors import InvalidRequest
from runs.models import Scope

FILTERS = {
    "status": ApprovalRequest.Status.values,
    "risk": Risk.values,
    "gate": Gate.values,
}


def _tenant_requests(request):
    # A deleted thread's requests went with it: their payloads are unreadable,
    # and like the thread itself they answer 404.
    return (
        ApprovalRequest.objects.for_tenant(request.principal.tenant)
        .filter(thread__deleted_at__isnull=True)
        .select_related("thread", "thread__tenant")
    )


def _render(approval: ApprovalRequest, serializer_class=ApprovalSerializer, **extra):
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
                "required_approvals",
                "created_at",
                "due_at",
                "escalation_level",
            )
        },
        "decisions": shown.decisions_shown,
        **extra,
    }
    return serializer_class(data).data


class ApprovalListView(generics.ListAPIView):
    required_scope = Scope.APPROVALS
    serializer_class = ApprovalSummarySerializer

    @extend_schema(
        summary="Approval requests",
        parameters=[
            OpenApiParameter("status", str, enum=FILTERS["status"]),
            OpenApiParameter("risk", str, enum=FILTERS["risk"]),
            OpenApiParameter("gate", str, enum=FILTERS["gate"]),
            OpenApiParameter("thread_id", str),
        ],
    )
    def get(self, request, *args, **kwargs):
        return super().get(request, *args, **kwargs)

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation
            return ApprovalRequest.objects.none()
        queryset = _tenant_requests(self.request)
        params = self.request.query_params
        for name, allowed in FILTERS.items():
            value = params.get(name)
            if value is None:
                continue
            if value not in allowed:
                raise InvalidRequest(
                    f"{name} must be one of {', '.join(allowed)}", field=name
                )
            queryset = queryset.filter(**{name: value})
        if params.get("thread_id"):
            queryset = queryset.filter(thread__thread_id=params["thread_id"])
        return queryset


class ApprovalDetailView(APIView):
    required_scope = Scope.APPROVALS

    @extend_schema(responses=ApprovalSerializer, summary="An approval request")
    def get(self, request, approval_id):
        approval = generics.get_object_or_404(_tenant_requests(request), pk=approval_id)
        body = _render(approval)
        approval_read(approval=approval, actor=actor_for(request))
        return Response(body)


class ApprovalDecisionView(APIView):
    required_scope = Scope.APPROVALS

    @extend_schema(
        request=DecideSerializer,
        responses=DecisionResultSerializer,
        summary="Decide an approval request (resumes the run once settled)",
    )
    def post(self, request, approval_id):
        approval = generics.get_object_or_404(_tenant_requests(request), pk=approval_id)
        body = DecideSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        principal = request.principal
        if principal.api_key is not None:
            reviewer = Reviewer.for_api_key(
                principal.api_key, on_behalf_of=body.validated_data["reviewer"]
            )
        else:
            reviewer = Reviewer.for_user(request.user)
        approval, run = approval_decide(
            approval=approval,
            reviewer=reviewer,
            approved=body.validated_data["approved"],
            note=body.validated_data["note"],
            args=body.validated_data.get("args"),
        )
        resumed = {"run_id": run.id, "status": run.status} if run else None
        return Response(
            _render(approval, DecisionResultSerializer, resumed_run=resumed)
        )
