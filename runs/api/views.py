"""The runs API: agents, threads, runs, state, history, resume, fork (api.md)."""

from __future__ import annotations

import logging
import re
from urllib.parse import urlencode

from asgiref.sync import sync_to_async
from django.db import transaction
from django.http import Http404, StreamingHttpResponse
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import exceptions, generics, status
from rest_framework.response import Response
from rest_framework.views import APIView

from audit.services import Actor
from runs import outages, permissions, registry, selectors, services, streaming
from runs.api.filters import ThreadFilter
from runs.api.idempotency import IdempotentWrites, shows_thread_content
from runs.api.parsers import SafeJSONRenderer
from runs.api.serializers import (
    AgentSerializer,
    ApprovalRequiredSerializer,
    ErrorSerializer,
    ForkResultSerializer,
    ForkSerializer,
    HistoryEntrySerializer,
    ResumeSerializer,
    RunCreateSerializer,
    RunQueuedSerializer,
    RunSerializer,
    StateSerializer,
    ThreadCreateSerializer,
    ThreadDetailSerializer,
    ThreadSerializer,
    body_validated,
    represent,
)
from runs.errors import InvalidRequest
from runs.models import Run, Scope, Thread

logger = logging.getLogger(__name__)

MAX_HISTORY = 200

GATE_CONFLICT = OpenApiResponse(
    ApprovalRequiredSerializer,
    description="`approval_required` (with `pending_approvals`) when the change "
    "would pass an approval gate without a decision; otherwise the plain error "
    "body with `run_in_progress`, `thread_interrupted`, `thread_not_interrupted` "
    "or `version_skew`.",
)
FORBIDDEN = OpenApiResponse(ErrorSerializer, description="Missing scope or role.")


def actor_for(request) -> Actor:
    """The audit actor of an API request: the key, or the logged-in person."""
    principal = request.principal
    if principal.api_key is not None:
        return Actor.api_key(principal.api_key)
    return Actor.user(request.user)


def validated(serializer_class, request) -> dict:
    """The request body checked by a serializer: a 400 naming fields otherwise."""
    return body_validated(serializer_class, request.data)


def queued(run: Run) -> Response:
    return Response(
        {"run_id": run.id, "status": run.status}, status=status.HTTP_202_ACCEPTED
    )


def require_time_travel(request) -> None:
    """Forks and runs from a checkpoint need the time_travel scope."""
    if not request.principal.can(Scope.TIME_TRAVEL, write=True):
        raise exceptions.PermissionDenied(
            "This needs the 'time_travel' scope (write), which the caller lacks."
        )


def reads_content(request) -> bool:
    """Whether the caller may see decrypted content (interrupt values, run
    errors) in a response that shows a thread's records: a tenant admin, by
    session or personal key, sees the records with the content withheld."""
    return permissions.can(request.principal, permissions.READ_STATE)


class TenantThreadMixin(IdempotentWrites):
    """Looks threads up within the caller's tenant: another tenant's is a 404."""

    required_scope = Scope.RUNS

    def get_thread(self) -> Thread:
        thread = selectors.live_thread(
            self.request.principal.tenant, self.kwargs["thread_id"]
        )
        if thread is None:
            raise Http404
        return thread

    def get_locked_thread(self) -> Thread:
        """The thread, its row locked in the caller's transaction: for a
        change of it, found and locked in one statement (where the look-up
        and the change's own lock were two)."""
        thread = services.live_thread_locked(
            self.request.principal.tenant, self.kwargs["thread_id"]
        )
        if thread is None:
            raise Http404
        return thread


class AgentListView(APIView):
    required_scope = Scope.RUNS

    @extend_schema(responses=AgentSerializer(many=True), summary="Registered agents")
    def get(self, request):
        in_flight = selectors.threads_in_flight(request.principal.tenant)
        specs = sorted(registry.agents().values(), key=lambda s: (s.name, s.version))
        rows = [
            {
                "name": spec.name,
                "version": spec.version,
                "description": spec.description,
                "draining": spec.draining,
                "threads_in_flight": in_flight.get((spec.name, spec.version), 0),
            }
            for spec in specs
        ]
        return Response(AgentSerializer(rows, many=True).data)


class ThreadListCreateView(IdempotentWrites, generics.ListAPIView):
    required_scope = Scope.RUNS
    serializer_class = ThreadSerializer

    filterset_class = ThreadFilter

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation
            return Thread.objects.none()
        return Thread.objects.for_tenant(self.request.principal.tenant)

    @extend_schema(summary="List threads")
    def get(self, request, *args, **kwargs):
        return super().get(request, *args, **kwargs)

    @extend_schema(
        request=ThreadCreateSerializer,
        responses={201: ThreadSerializer},
        summary="Create a thread",
    )
    def post(self, request):
        body = validated(ThreadCreateSerializer, request)
        thread = services.thread_create(
            tenant=request.principal.tenant,
            actor=actor_for(request),
            agent=body["agent"],
            thread_id=body.get("thread_id"),
            metadata=body.get("metadata"),
        )
        # Its metadata, removed with the thread.
        shows_thread_content(request, thread)
        return Response(
            represent(ThreadSerializer, thread), status=status.HTTP_201_CREATED
        )


class ThreadDetailView(TenantThreadMixin, APIView):
    @extend_schema(responses=ThreadDetailSerializer, summary="A thread")
    def get(self, request, thread_id):
        thread = self.get_thread()
        # Interrupt values are content: without threads.read_state (a tenant
        # admin) the thread comes without them; its status and pending
        # approvals still say that it waits.
        if reads_content(request):
            thread.interrupts = services.thread_interrupts_read(
                thread=thread, actor=actor_for(request)
            )
        thread.pending_approvals = selectors.pending_approval_ids(thread)
        return Response(represent(ThreadDetailSerializer, thread))


class RunListCreateView(TenantThreadMixin, generics.ListAPIView):
    serializer_class = RunSerializer

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation
            return Run.objects.none()
        return Run.objects.filter(thread=self.get_thread()).select_related("thread")

    @extend_schema(summary="Runs of a thread")
    def get(self, request, *args, **kwargs):
        return super().get(request, *args, **kwargs)

    def get_serializer(self, *args, **kwargs):
        if getattr(self, "swagger_fake_view", False):  # schema generation
            return super().get_serializer(*args, **kwargs)
        reveal = reads_content(self.request)
        if args and kwargs.get("many") and reveal:
            # The serializer decrypts the errors of the page's failed runs:
            # one event for the page.
            services.run_errors_read(
                thread=self.get_thread(),
                runs=list(args[0]),
                actor=actor_for(self.request),
            )
        kwargs.setdefault("context", {})["reveal_errors"] = reveal
        return super().get_serializer(*args, **kwargs)

    @extend_schema(
        request=RunCreateSerializer,
        responses={202: RunQueuedSerializer, 403: FORBIDDEN, 409: GATE_CONFLICT},
        summary="Start a run (from a checkpoint: time_travel scope)",
    )
    def post(self, request, thread_id):
        with transaction.atomic():
            thread = self.get_locked_thread()
            body = validated(RunCreateSerializer, request)
            if body.get("checkpoint_id"):
                require_time_travel(request)
            run = services.run_start_locked(
                thread=thread,
                input=body["input"],
                checkpoint_id=body.get("checkpoint_id", ""),
                actor=actor_for(request),
            )
        return queued(run)


# The longest a run's GET waits for it to stop (`?wait=`), in seconds: within
# the idle timeout of common proxies (60 s), as it sends nothing meanwhile
# (runs.api.schema's FIELD_DOCS["wait"] says so).
MAX_WAIT = 30
_SECONDS = re.compile(r"[0-9]{1,2}(\.[0-9]{1,3})?")


def wait_seconds(request) -> float:
    """The `wait` query parameter: 0 to MAX_WAIT seconds, 0 when absent."""
    raw = request.query_params.get("wait")
    if raw is None:
        return 0.0
    if not _SECONDS.fullmatch(raw) or float(raw) > MAX_WAIT:
        raise InvalidRequest(
            f"wait is a number of seconds from 0 to {MAX_WAIT}", field="wait"
        )
    return float(raw)


def run_body(request, run: Run, *, reveal: bool) -> dict:
    """A run as its GET answers it; a revealed error is an audit event."""
    if reveal:
        services.run_errors_read(
            thread=run.thread, runs=[run], actor=actor_for(request)
        )
    return represent(RunSerializer, run, reveal_errors=reveal)


def _run_body_now(request, run: Run, reveal: bool) -> bytes:
    current = selectors.live_run(request.principal.tenant, run.thread.thread_id, run.pk)
    if current is None:
        # The thread was deleted meanwhile: its content is gone, its run is
        # shown without it.
        current, reveal = Run.objects.filter(pk=run.pk).first() or run, False
    return SafeJSONRenderer().render(run_body(request, current, reveal=reveal))


async def _once_stopped(request, run: Run, seconds: float, reveal: bool):
    """The run's body once it has stopped, or after `seconds` (streaming.stopped
    waits in the event loop, with no database connection). A run whose `end`
    carried its columns is answered from them in the event loop: no hop to the
    request's thread, no connection, no statement between the wake and the
    answer (~2 ms of the ~5 ms from the worker's end to the client, issue
    15); the body is the one the row would give, error-free so with nothing to
    audit. Otherwise the run is read again.

    The status line (200) has gone out before this runs, so a database outage
    while waiting or reading the run cannot become a 503: the run is answered
    as it was read before the wait (still queued or running), a whole JSON
    body the client can ask again after. Its error is withheld, as no audit
    event can record reading it (an active run has none anyway). That body
    is made only then, from the row read before the wait (`run`, which
    nothing changes meanwhile): with the error withheld, RunSerializer reads
    nothing but the row's own fields, so no query, where rendering it on
    every wait cost ~0.2 ms."""
    try:
        ended = await streaming.stopped(
            run.pk, within=seconds, after=streaming.known_start(run)
        )
        if ended is not None:
            # Error-free: revealing shows nothing more and audits nothing.
            body = SafeJSONRenderer().render(
                run_body(request, streaming.as_ended(run, ended), reveal=False)
            )
        else:
            body = await sync_to_async(_run_body_now)(request, run, reveal)
    except outages.DATABASE_ERRORS as error:
        logger.warning("run %s: answered as before its wait (%r)", run.pk, error)
        body = SafeJSONRenderer().render(run_body(request, run, reveal=False))
    yield body


class RunDetailView(TenantThreadMixin, APIView):
    @extend_schema(
        responses=RunSerializer,
        parameters=[OpenApiParameter("wait", float)],
        summary="A run (with `wait`: once it stops)",
    )
    def get(self, request, thread_id, run_id):
        # The run with its thread in one query: clients poll this.
        run = selectors.live_run(request.principal.tenant, thread_id, run_id)
        if run is None:
            raise Http404
        seconds = wait_seconds(request)
        reveal = reads_content(request)
        if seconds and run.is_active:
            # The wait holds no database connection: given back here, on the
            # view's thread, rather than in a hop of its own (streaming.stopped).
            # `run`, read before the wait, is the answer if the database goes
            # away (_once_stopped).
            streaming.release_connection()
            return StreamingHttpResponse(
                _once_stopped(request, run, seconds, reveal),
                content_type="application/json",
                headers={"Cache-Control": "no-store"},
            )
        return Response(run_body(request, run, reveal=reveal))


class ResumeView(TenantThreadMixin, APIView):
    @extend_schema(
        request=ResumeSerializer,
        responses={202: RunQueuedSerializer, 409: GATE_CONFLICT},
        summary="Resume an input interrupt (raw LangGraph resume value)",
        description="For input interrupts only: an approval gate (an interrupt "
        "whose payload carries `action`) is resumed by a decision on its "
        "approval request, and a raw resume of it answers 409 "
        "`approval_required` naming the requests.",
    )
    def post(self, request, thread_id):
        with transaction.atomic():
            thread = self.get_locked_thread()
            body = validated(ResumeSerializer, request)
            run = services.run_resume_locked(
                thread=thread, resume=body["resume"], actor=actor_for(request)
            )
        return queued(run)


class StateView(TenantThreadMixin, APIView):
    required_capability = permissions.READ_STATE

    @extend_schema(responses=StateSerializer, summary="The latest state (audited)")
    def get(self, request, thread_id, checkpoint_id=None):
        thread = self.get_thread()
        try:
            snapshot = services.thread_state(
                thread=thread, actor=actor_for(request), checkpoint_id=checkpoint_id
            )
        except InvalidRequest:
            if checkpoint_id:
                return _not_found("no such checkpoint in this thread")
            raise
        if snapshot is None:
            return _not_found("the thread has no checkpoint yet")
        return Response(StateSerializer(selectors.state_body(snapshot)).data)


class StateAtCheckpointView(StateView):
    @extend_schema(
        responses=StateSerializer,
        summary="The state at a checkpoint (audited)",
        operation_id="threads_state_at_checkpoint",
    )
    def get(self, request, thread_id, checkpoint_id=None):
        return super().get(request, thread_id, checkpoint_id)


def _not_found(message: str) -> Response:
    return Response({"code": "not_found", "message": message}, status=404)


class HistoryView(TenantThreadMixin, APIView):
    @extend_schema(
        responses=HistoryEntrySerializer(many=True),
        parameters=[
            OpenApiParameter("limit", int, description=f"At most {MAX_HISTORY}."),
            OpenApiParameter("before", str, description="A checkpoint id: older ones."),
        ],
        summary="Checkpoints, newest first",
    )
    def get(self, request, thread_id):
        thread = self.get_thread()
        raw_limit = request.query_params.get("limit", "50")
        if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= MAX_HISTORY:
            raise InvalidRequest(f"limit must be 1 to {MAX_HISTORY}", field="limit")
        limit = int(raw_limit)
        before = request.query_params.get("before") or None
        entries = selectors.thread_history(thread, limit=limit, before=before)
        next_url = None
        if len(entries) == limit:
            query = urlencode({"limit": limit, "before": entries[-1]["checkpoint_id"]})
            next_url = request.build_absolute_uri(f"{request.path}?{query}")
        return Response(
            {
                "results": HistoryEntrySerializer(entries, many=True).data,
                "next": next_url,
            }
        )


class ForkView(TenantThreadMixin, APIView):
    required_scope = Scope.TIME_TRAVEL

    @extend_schema(
        request=ForkSerializer,
        responses={201: ForkResultSerializer, 403: FORBIDDEN, 409: GATE_CONFLICT},
        summary="Fork: a new checkpoint with changed values (time_travel scope)",
        description="Refused with 409 `approval_required` while the thread has an "
        "open approval request, and when the fork would write as a gated node, "
        "as a node past a gate, or leave the thread to continue past a gate.",
    )
    def post(self, request, thread_id):
        thread = self.get_thread()
        body = validated(ForkSerializer, request)
        checkpoint_id = services.thread_fork(
            thread=thread,
            checkpoint_id=body["checkpoint_id"],
            values=body["values"],
            as_node=body.get("as_node"),
            actor=actor_for(request),
        )
        return Response(
            {"checkpoint_id": checkpoint_id}, status=status.HTTP_201_CREATED
        )
