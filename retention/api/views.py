"""Deletion: DELETE /threads/{thread_id} and /deletion-requests (by thread or
data subject), and the status and record of a request."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import exceptions, generics, serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from retention.api.serializers import (
    DeletionRequestCreateSerializer,
    DeletionRequestSerializer,
)
from retention.models import DeletionRequest
from retention.services import subject_deletion_request, thread_deletion_request
from runs import permissions
from runs.api.idempotency import IdempotentWrites
from runs.api.permissions import TenantScopePermission, resolve_principal
from runs.api.views import ThreadDetailView, actor_for
from runs.models import Scope, Thread


class ThreadDetailDeleteView(ThreadDetailView):
    """The thread detail, plus DELETE (retention owns deletion requests)."""

    @property
    def required_capability(self) -> str | None:
        # Deleting is asking for a deletion, whoever asks and however.
        if self.request.method == "DELETE":
            return permissions.REQUEST_DELETION
        return None

    @extend_schema(
        responses={
            202: inline_serializer(
                "DeletionAccepted", {"deletion_request": serializers.UUIDField()}
            )
        },
        summary="Delete a thread: its key is destroyed at once, its rows removed",
    )
    def delete(self, request, thread_id):
        thread = self.get_thread()
        deletion = thread_deletion_request(thread=thread, actor=actor_for(request))
        return Response(
            {"deletion_request": deletion.pk}, status=status.HTTP_202_ACCEPTED
        )


class DeletionRequestPermission(TenantScopePermission):
    """Asking for a deletion and reading the requests are capabilities of
    their own (runs.permissions: deletion.request, deletion.read), not a
    scope's writes: compliance officers ask, though their role reads runs
    only. Service keys have them with the `runs` scope; a personal key needs
    its person's role and that scope."""

    def has_permission(self, request, view) -> bool:
        principal = resolve_principal(request)
        request.principal = principal
        write = self.writes(request, view)
        capability = (
            permissions.REQUEST_DELETION if write else permissions.READ_DELETIONS
        )
        if not permissions.can(principal, capability):
            raise exceptions.PermissionDenied(
                "Deletion requests need an API key with the 'runs' scope, or the "
                "compliance officer or tenant admin role"
                + ("" if write else " (auditors may read them)")
                + "."
            )
        return True


class DeletionRequestMixin(IdempotentWrites):
    permission_classes = [DeletionRequestPermission]
    required_scope = Scope.RUNS

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation
            return DeletionRequest.objects.none()
        return DeletionRequest.objects.for_tenant(self.request.principal.tenant)


class DeletionRequestListCreateView(DeletionRequestMixin, generics.ListAPIView):
    serializer_class = DeletionRequestSerializer

    @extend_schema(summary="Deletion requests, newest first")
    def get(self, request, *args, **kwargs):
        return super().get(request, *args, **kwargs)

    @extend_schema(
        request=DeletionRequestCreateSerializer,
        responses={202: DeletionRequestSerializer},
        summary="Delete a thread, or everything of a data subject",
        description=(
            "The threads' keys are destroyed at once (their content is "
            "unreadable from then on) and their rows removed by the next "
            "sweep; threads under legal hold wait (status on_hold). The audit "
            "trail is kept; the request's record says what was removed."
        ),
    )
    def post(self, request):
        body = DeletionRequestCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        tenant = request.principal.tenant
        actor = actor_for(request)
        if "subject" in body.validated_data:
            deletion = subject_deletion_request(
                tenant=tenant, subject=body.validated_data["subject"], actor=actor
            )
        else:
            thread = generics.get_object_or_404(
                Thread.objects.for_tenant(tenant),
                thread_id=body.validated_data["thread_id"],
            )
            deletion = thread_deletion_request(thread=thread, actor=actor)
        return Response(
            DeletionRequestSerializer(deletion).data, status=status.HTTP_202_ACCEPTED
        )


class DeletionRequestDetailView(DeletionRequestMixin, APIView):
    @extend_schema(
        responses=DeletionRequestSerializer,
        summary="A deletion request: its status and its record",
    )
    def get(self, request, request_id):
        deletion = generics.get_object_or_404(self.get_queryset(), pk=request_id)
        return Response(DeletionRequestSerializer(deletion).data)
