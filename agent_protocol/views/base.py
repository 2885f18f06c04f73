"""What every Agent Protocol view shares: authentication, scope, lookups."""

from __future__ import annotations

from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import APIView

from agent_protocol.access import AUTHENTICATION, PERMISSIONS
from runs import permissions, selectors
from runs.api.errors import ApiError
from runs.api.parsers import SafeJSONRenderer
from runs.models import Run, Scope, Thread


class ProtocolView(APIView):
    authentication_classes = AUTHENTICATION
    permission_classes = PERMISSIONS
    required_scope = Scope.RUNS
    # The protocol's threads carry their values, and its runs answer with
    # their output: a caller whose role reads no decrypted content (a tenant
    # admin, by session or personal key) has no use of it and is refused
    # whole, so no path of it can leak content to them.
    required_capability = permissions.READ_STATE
    # Not part of /api/v1's OpenAPI document: the Agent Protocol is described
    # by LangGraph's SDKs, and what Gatehouse does with it by
    # docs/langgraph-clients.md.
    schema = None

    def thread(self, thread_id: str) -> Thread:
        """The caller's tenant's thread: another tenant's is not found."""
        thread = selectors.live_thread(self.request.principal.tenant, thread_id)
        if thread is None:
            raise self.not_found(thread_id)
        return thread

    @staticmethod
    def not_found(thread_id: str) -> exceptions.NotFound:
        return exceptions.NotFound(f"Thread {thread_id} not found.")

    def run(self, thread_id: str, run_id) -> Run:
        """A run of the caller's tenant's thread, with the thread (and its
        tenant) read in the same query: joining or reading a run is one."""
        run = selectors.live_run(self.request.principal.tenant, thread_id, run_id)
        if run is None:
            self.thread(thread_id)  # the thread not found, if that is why
            raise exceptions.NotFound(f"Run {run_id} not found.")
        return run


class EventStreamRenderer(SafeJSONRenderer):
    """Lets a client that accepts only text/event-stream reach a streaming
    view; an error before the stream starts is still the JSON error body."""

    media_type = "text/event-stream"


class StreamingView(ProtocolView):
    renderer_classes = [SafeJSONRenderer, EventStreamRenderer]


class NotSupported(ApiError):
    """A LangGraph endpoint Gatehouse answers with a clear refusal (listed in
    docs/langgraph-clients.md), never a bare 404."""

    def __init__(self, message: str) -> None:
        super().__init__(
            message,
            code="not_supported",
            status_code=status.HTTP_405_METHOD_NOT_ALLOWED,
        )


def refusal(message: str):
    """A view class that answers every method with NotSupported(message)."""

    class Refusal(StreamingView):
        def _refuse(self, request, *args, **kwargs):
            raise NotSupported(message)

        get = post = put = patch = delete = _refuse

    return Refusal


def no_content() -> Response:
    return Response(status=status.HTTP_204_NO_CONTENT)
