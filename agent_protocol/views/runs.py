"""Runs: create (background, wait, stream), list, read, cancel, join.

A run is created by the runs services, so every rule of /api/v1 holds: one
run of a thread at a time (unless the multitask strategy says otherwise), a
resume (`command`) only of an interrupted thread and never past an approval
gate, a run from a checkpoint through the same checks. Runs execute on
workers; waiting and streaming responses are relayed from the worker's
events by agent_protocol.relay, in the web process's event loop.
"""

from __future__ import annotations

from django.db import transaction
from django.http import StreamingHttpResponse
from rest_framework import exceptions, status
from rest_framework.response import Response

from agent_protocol import catalog, relay, shapes
from agent_protocol.requests import (
    RunCreate,
    RunsCancel,
    checkpoint_id_of,
    stream_modes,
    validated,
)
from agent_protocol.run_webhooks import run_webhook_register
from agent_protocol.views.base import (
    NotSupported,
    ProtocolView,
    StreamingView,
    no_content,
)
from runs import services, streaming
from runs.api.views import actor_for, require_time_travel
from runs.errors import InvalidRequest, StateConflict
from runs.models import Run, Thread

STREAM_HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}


def _run_path(thread: Thread, run: Run) -> str:
    # Relative to the API's root, as LangGraph's SDKs resolve it against
    # their base URL (which ends in /langgraph).
    return f"/threads/{thread.thread_id}/runs/{run.id}"


def _assistant(body: dict) -> catalog.Resolved:
    resolved = catalog.resolve(body["assistant_id"])
    if resolved is None:
        raise exceptions.NotFound(f"Assistant {body['assistant_id']} not found.")
    return resolved


def create_run(request, thread: Thread, body: dict) -> Run:
    """Start or resume a run of `thread` as the body asks, with its webhook,
    in the caller's transaction, which holds the thread's row locked and
    read it after the lock (services.live_thread_locked): the run services'
    `_locked` forms, so no second read of the row and no savepoint of their
    own, whose release would be one more round trip after the `run.queued`
    audit event, with the tenant's audit sequence row held
    (audit.services.record)."""
    run = _queue_run(request, thread, body)
    if body.get("webhook"):
        run_webhook_register(run=run, thread=thread, url=body["webhook"])
    return run


def _queue_run(request, thread: Thread, body: dict) -> Run:
    resolved = _assistant(body)
    options = services.RunOptions(
        stream_modes=body["stream_modes"],
        stream_subgraphs=body["stream_subgraphs"],
        metadata=body.get("metadata") or {},
        multitask=body["multitask_strategy"],
    )
    actor = actor_for(request)
    if body.get("command"):
        if checkpoint_id_of(body):
            raise InvalidRequest(
                "a resume continues from the interrupt: no checkpoint",
                field="checkpoint_id",
            )
        return services.run_resume_locked(
            thread=thread,
            resume=body["command"]["resume"],
            actor=actor,
            options=options,
            agent=resolved.name,
            version=resolved.version,
        )
    if checkpoint_id_of(body):
        require_time_travel(request)
    return services.run_start_locked(
        thread=thread,
        input=body.get("input"),
        actor=actor,
        checkpoint_id=checkpoint_id_of(body) or "",
        agent=resolved.name,
        version=resolved.version,
        options=options,
    )


class ThreadRunsMixin:
    def start(self, request, thread_id: str) -> tuple[dict, Thread, Run]:
        """Validate the body, find (or create) the thread, create the run.

        The thread is found and locked in one statement, in the transaction
        of the run it starts (as /api/v1's run start: runs.api.views). A thread
        that `if_not_exists` creates is made in its own transaction first,
        kept whatever the run's start then answers, as before."""
        body = validated(RunCreate, request.data)
        started = self._start_locked(request, thread_id, body)
        if started is None:
            if body["if_not_exists"] != "create":
                raise self.not_found(thread_id)
            try:
                services.thread_create(
                    tenant=request.principal.tenant,
                    agent=_assistant(body).name,
                    actor=actor_for(request),
                    thread_id=thread_id,
                )
            except StateConflict:
                pass  # created meanwhile by another request
            started = self._start_locked(request, thread_id, body)
            if started is None:  # deleted meanwhile
                raise self.not_found(thread_id)
        return (body, *started)

    @staticmethod
    def _start_locked(request, thread_id: str, body: dict) -> tuple[Thread, Run] | None:
        """The run created in a transaction holding the tenant's live thread
        `thread_id` locked; None, and nothing done, if there is no such
        thread."""
        with transaction.atomic():
            thread = services.live_thread_locked(request.principal.tenant, thread_id)
            if thread is None:
                return None
            return thread, create_run(request, thread, body)


def _target(request, run: Run) -> relay.Target:
    return relay.Target.of(run, actor_for(request))


class ThreadRunsView(ThreadRunsMixin, ProtocolView):
    def get(self, request, thread_id):
        thread = self.thread(thread_id)
        try:
            limit = min(int(request.query_params.get("limit", 10)), 1000)
            offset = max(int(request.query_params.get("offset", 0)), 0)
        except ValueError:
            raise InvalidRequest(
                "limit and offset are numbers", field="limit"
            ) from None
        runs = Run.objects.filter(thread=thread).order_by("-created_at")
        wanted = request.query_params.get("status")
        if wanted:
            if wanted not in shapes.RUN_STATUS_FROM_SDK:
                raise InvalidRequest(
                    f"status is one of {', '.join(shapes.RUN_STATUS_FROM_SDK)}",
                    field="status",
                )
            runs = runs.filter(status__in=shapes.RUN_STATUS_FROM_SDK[wanted])
        return Response(
            [shapes.run_of(run, thread) for run in runs[offset : offset + limit]]
        )

    def post(self, request, thread_id):
        # The thread as the run's start left it (its agent bound, if it had
        # none): the row read under the lock and changed by the start.
        _, thread, run = self.start(request, thread_id)
        return Response(
            shapes.run_of(run, thread),
            headers={"Content-Location": _run_path(thread, run)},
        )


class ThreadRunWaitView(ThreadRunsMixin, ProtocolView):
    def post(self, request, thread_id):
        _, thread, run = self.start(request, thread_id)
        path = _run_path(thread, run)
        return StreamingHttpResponse(
            relay.wait(_target(request, run), how="wait"),
            content_type="application/json",
            headers={
                **STREAM_HEADERS,
                "Content-Location": path,
                "Location": f"{path}/join",
            },
        )


class ThreadRunStreamView(ThreadRunsMixin, StreamingView):
    def post(self, request, thread_id):
        body, thread, run = self.start(request, thread_id)
        path = _run_path(thread, run)
        return StreamingHttpResponse(
            relay.sse(
                _target(request, run),
                modes=None,
                cancel_on_disconnect=body.get("on_disconnect") == "cancel",
            ),
            content_type="text/event-stream",
            headers={
                **STREAM_HEADERS,
                "Content-Location": path,
                "Location": f"{path}/stream",
            },
        )


class RunDetailView(ProtocolView):
    def get(self, request, thread_id, run_id):
        run = self.run(thread_id, run_id)
        return Response(shapes.run_of(run, run.thread))

    def delete(self, request, thread_id, run_id):
        self.run(thread_id, run_id)
        raise NotSupported(
            "runs are not deleted: they are what the audit trail records; "
            "delete the thread to remove its content"
        )


def _cancel_action(request) -> str:
    action = request.query_params.get("action", Run.CancelAction.INTERRUPT)
    if action not in Run.CancelAction.values:
        raise InvalidRequest(
            f"action is one of {', '.join(Run.CancelAction.values)}", field="action"
        )
    return action


async def _after_end(target: relay.Target):
    async for chunk in relay.wait(target, how="cancel"):
        if chunk != b"\n":
            yield b"null"
        else:
            yield chunk


class RunCancelView(ProtocolView):
    def post(self, request, thread_id, run_id):
        run = self.run(thread_id, run_id)
        thread = run.thread
        services.run_cancel(
            thread=thread,
            run=run,
            actor=actor_for(request),
            action=_cancel_action(request),
        )
        if request.query_params.get("wait", "0").lower() in ("1", "true"):
            return StreamingHttpResponse(
                _after_end(_target(request, run)),
                content_type="application/json",
                headers=STREAM_HEADERS,
            )
        return Response(status=status.HTTP_202_ACCEPTED)


class RunsCancelView(ProtocolView):
    def post(self, request):
        body = validated(RunsCancel, request.data)
        action = _cancel_action(request)
        if not body.get("thread_id") and not body.get("run_ids"):
            raise InvalidRequest("name a thread_id or run_ids", field="run_ids")
        runs = Run.objects.for_tenant(request.principal.tenant).select_related(
            "thread__tenant"
        )
        if body.get("thread_id"):
            runs = runs.filter(thread=self.thread(body["thread_id"]))
        if body.get("run_ids"):
            runs = runs.filter(pk__in=body["run_ids"])
            if runs.count() != len(set(body["run_ids"])):
                raise exceptions.NotFound("Run not found.")
        wanted = {
            "pending": [Run.Status.QUEUED],
            "running": [Run.Status.RUNNING],
        }.get(body.get("status") or "all", Run.ACTIVE)
        for run in runs.filter(status__in=wanted):
            try:
                services.run_cancel(
                    thread=run.thread, run=run, actor=actor_for(request), action=action
                )
            except StateConflict:
                continue  # ended meanwhile, or it carries a reviewer's decision
        return no_content()


class RunJoinView(ProtocolView):
    def get(self, request, thread_id, run_id):
        run = self.run(thread_id, run_id)
        return StreamingHttpResponse(
            relay.wait(_target(request, run), how="join"),
            content_type="application/json",
            headers=STREAM_HEADERS,
        )


class RunJoinStreamView(StreamingView):
    def get(self, request, thread_id, run_id):
        run = self.run(thread_id, run_id)
        thread = run.thread
        # httpx sends an unset stream_mode as an empty value.
        requested = [m for m in request.query_params.getlist("stream_mode") if m]
        modes = stream_modes(requested) if requested else None
        raw_last = request.headers.get("Last-Event-ID")
        after = streaming.EventId.parse(raw_last)
        if raw_last and after is None:
            raise InvalidRequest(
                "Last-Event-ID is not an id this server sent", field="Last-Event-ID"
            )
        return StreamingHttpResponse(
            relay.sse(
                _target(request, run),
                modes=modes,
                after=after or streaming.START,
                live=after is None,
                cancel_on_disconnect=request.query_params.get(
                    "cancel_on_disconnect", "false"
                ).lower()
                in ("1", "true"),
            ),
            content_type="text/event-stream",
            headers={**STREAM_HEADERS, "Location": f"{_run_path(thread, run)}/stream"},
        )
