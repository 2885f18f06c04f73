"""The audit API: events (paginated, or streamed as CSV / JSON Lines), thread
timelines and chain verification. Read access needs the `audit` scope."""

from __future__ import annotations

import datetime

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import exceptions, generics
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from audit import anchors, export, selectors, services
from audit.api.filters import AuditEventFilter
from audit.api.pagination import AuditEventPagination
from audit.api.serializers import (
    AuditEventSerializer,
    SignedHeadSerializer,
    TimelineQuerySerializer,
    TimelineSerializer,
    VerificationSerializer,
    VerifyAgainstSerializer,
)
from audit.models import AuditEvent
from runs.models import Scope


class CSVRenderer(BaseRenderer):
    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        # Exports are streamed by the view; this renderer only names the
        # format for content negotiation.
        return b"" if data is None else str(data).encode()


class JSONLinesRenderer(CSVRenderer):
    media_type = "application/x-ndjson"
    format = "jsonl"


class FormatParameterFirst(DefaultContentNegotiation):
    """`?format=` wins over the Accept header, and an unknown one is a 400.

    DRF would answer 406 to `?format=csv` sent with `Accept: application/json`
    (what many HTTP clients send by default) and 404 to an unknown format.
    """

    def select_renderer(self, request, renderers, format_suffix=None):
        wanted = format_suffix or request.query_params.get(
            self.settings.URL_FORMAT_OVERRIDE
        )
        if wanted:
            for renderer in renderers:
                if renderer.format == wanted:
                    return renderer, renderer.media_type
            known = ", ".join(renderer.format for renderer in renderers)
            raise exceptions.ValidationError({"format": [f"must be one of {known}."]})
        return super().select_renderer(request, renderers, format_suffix)


class JsonErrors:
    """Errors answer JSON even when the client asked for CSV or JSON Lines."""

    def finalize_response(self, request, response, *args, **kwargs):
        if isinstance(response, Response) and response.status_code >= 400:
            request.accepted_renderer = JSONRenderer()
            request.accepted_media_type = JSONRenderer.media_type
        return super().finalize_response(request, response, *args, **kwargs)


FORMAT_PARAMETER = OpenApiParameter(
    "format",
    str,
    enum=["json", "csv", "jsonl"],
    description=(
        "json (default, paginated), or csv / jsonl: the whole filtered result "
        "streamed as a download. `Accept: text/csv` or "
        "`Accept: application/x-ndjson` do the same."
    ),
)


class AuditEventListView(JsonErrors, generics.ListAPIView):
    """The tenant's events matching every filter given, oldest first.

    `date` with `tz` selects one local day (23 or 25 hours across a DST
    change). With `?format=csv|jsonl` or an Accept header naming those types,
    the whole filtered result streams as a download instead of a page.
    """

    required_scope = Scope.AUDIT
    serializer_class = AuditEventSerializer
    pagination_class = AuditEventPagination
    filterset_class = AuditEventFilter
    renderer_classes = [JSONRenderer, CSVRenderer, JSONLinesRenderer]
    content_negotiation_class = FormatParameterFirst

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation
            return AuditEvent.objects.none()
        return selectors.event_list(tenant=self.request.principal.tenant)

    @extend_schema(
        summary="Audit events, oldest first, or an export",
        parameters=[FORMAT_PARAMETER],
        responses={
            (200, "application/json"): AuditEventSerializer(many=True),
            (200, "text/csv"): OpenApiResponse(OpenApiTypes.STR),
            (200, "application/x-ndjson"): OpenApiResponse(OpenApiTypes.STR),
        },
    )
    def get(self, request, *args, **kwargs):
        return super().get(request, *args, **kwargs)

    def list(self, request, *args, **kwargs):
        export_format = request.accepted_renderer.format
        if export_format not in export.EXPORTERS:
            return super().list(request, *args, **kwargs)
        queryset = self.filter_queryset(self.get_queryset())
        response = export.ExportResponse(
            export.EXPORTERS[export_format](queryset),
            content_type=export.CONTENT_TYPES[export_format],
        )
        tenant = request.principal.tenant.slug
        response["Content-Disposition"] = (
            f'attachment; filename="audit-{tenant}.{export_format}"'
        )
        response["Cache-Control"] = "no-store"
        response["X-Accel-Buffering"] = "no"  # let nginx pass the stream through
        return response


class ThreadTimelineView(JsonErrors, APIView):
    """What happened in one thread, told from its audit events. It outlives
    the thread's checkpoints and its deletion; 404 when the thread left no
    events in this tenant."""

    required_scope = Scope.AUDIT

    @extend_schema(
        summary="The compact timeline of one thread",
        parameters=[TimelineQuerySerializer],
        responses=TimelineSerializer,
    )
    def get(self, request, thread_id: str):
        params = TimelineQuerySerializer(data=request.query_params)
        params.is_valid(raise_exception=True)
        tz = params.validated_data.get("tz", datetime.UTC)
        timeline = selectors.thread_timeline(
            tenant=request.principal.tenant, thread_id=thread_id
        )
        if timeline is None:
            raise exceptions.NotFound(f"No audit events for thread {thread_id!r}.")
        body = {
            "thread_id": timeline.thread_id,
            "deleted": timeline.deleted,
            "events": timeline.events,
            "hidden": timeline.hidden,
            "truncated": timeline.truncated,
            "first_at": timeline.first_at,
            "last_at": timeline.last_at,
            "entries": timeline.entries,
            "story": timeline.story(tz),
        }
        return Response(TimelineSerializer(body).data)


class VerifyView(JsonErrors, APIView):
    """Recomputes the tenant's sealed chain from its blocks and events, names
    the first event that does not match, and keeps the result. POST a head
    saved earlier to check, as well, that the chain still holds it: nothing
    up to it was rewritten, re-sealed or removed since."""

    idempotency_exempt = "a check, not work: a retry verifies the chain again"

    required_scope = Scope.AUDIT

    @extend_schema(
        summary="Recompute the tenant's sealed chain",
        responses=VerificationSerializer,
    )
    def get(self, request):
        return Response(self._verify(request, against=None))

    @extend_schema(
        summary="Recompute the chain and check it against a saved head",
        request=VerifyAgainstSerializer,
        responses=VerificationSerializer,
    )
    def post(self, request):
        body = request.data if isinstance(request.data, dict) else {}
        try:
            against = anchors.head_parse(body.get("against"))
            return Response(self._verify(request, against=against))
        except anchors.InvalidHead as error:
            raise exceptions.ValidationError(
                {f"against.{error.field}": [str(error)]}
            ) from None

    def _verify(self, request, *, against) -> dict:
        verification = services.audit_verify(
            tenant=request.principal.tenant,
            checked_by=request.principal.label,
            against=against,
        )
        return VerificationSerializer(verification).data


class ChainBroken(exceptions.APIException):
    status_code = 409
    default_code = "audit_chain_broken"


class HeadView(JsonErrors, APIView):
    """The end of the tenant's sealed chain, signed with the audit key: keep
    it outside Gatehouse and check it later with POST /audit/verify."""

    required_scope = Scope.AUDIT

    @extend_schema(
        summary="The signed head of the tenant's chain", responses=SignedHeadSerializer
    )
    def get(self, request):
        try:
            head = anchors.chain_head(tenant=request.principal.tenant)
        except anchors.ChainHeadBroken as error:
            raise ChainBroken(
                f"The chain's last block does not verify ({error}); run "
                "GET /api/v1/audit/verify."
            ) from None
        return Response(SignedHeadSerializer(head.as_dict()).data)
