"""Threads: create, read, search, change, copy, delete; state and history.

Every read of a thread's values is an audit event, as under /api/v1:
`services.thread_state` and `services.thread_history` record it.
"""

from __future__ import annotations

import re
import uuid

from rest_framework import exceptions
from rest_framework.response import Response

from agent_protocol import catalog, shapes
from agent_protocol.requests import (
    History,
    StateAt,
    StateUpdate,
    ThreadCreate,
    ThreadFilter,
    ThreadSearch,
    ThreadUpdate,
    checkpoint_id_of,
    validated,
)
from agent_protocol.views.base import ProtocolView, no_content
from retention.services import thread_deletion_request
from runs import services
from runs.api.fields import query_flag
from runs.api.views import actor_for, require_time_travel
from runs.crypto import CryptoError, ThreadDeleted
from runs.errors import InvalidRequest, StateConflict
from runs.models import Thread

# Metadata keys a search may filter on: a JSON key, never a lookup path.
METADATA_KEY_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")  # fullmatch
SORT_FIELDS = {
    "thread_id": "thread_id",
    "status": "status",
    "created_at": "created_at",
    "updated_at": "updated_at",
    "state_updated_at": "updated_at",
}


def _snapshot(request, thread: Thread, **kwargs):
    return services.thread_state(thread=thread, actor=actor_for(request), **kwargs)


def _selected(body: dict, select: list[str] | None) -> dict:
    return {key: body[key] for key in select if key in body} if select else body


def _wants_state(select: list[str] | None) -> bool:
    """Whether a thread's body as selected shows content (a read to audit)."""
    return not select or bool({"values", "interrupts"} & set(select))


def _thread_body(request, thread: Thread, select: list[str] | None = None) -> dict:
    snapshot = _snapshot(request, thread) if _wants_state(select) else None
    return _selected(shapes.thread_of(thread, snapshot), select)


def _searched(thread: Thread, state) -> dict:
    """A thread of a search's page: one whose state could not be read shows
    its values as unreadable, and the rest of the page is still served."""
    if not isinstance(state, CryptoError):
        return shapes.thread_of(thread, state)
    body = shapes.thread_of(thread)
    if not isinstance(state, ThreadDeleted):
        body["values"] = {"unreadable": type(state).__name__}
    return body


def _agent_of(metadata: dict) -> str | None:
    """The agent a new thread's metadata names (graph_id or assistant_id);
    LangGraph keeps both in thread metadata, Gatehouse on the thread itself."""
    graph_id = metadata.pop("graph_id", None)
    assistant = metadata.pop("assistant_id", None)
    if graph_id is None and assistant is None:
        return None
    resolved = catalog.resolve(assistant or graph_id)
    if resolved is None or (graph_id and resolved.name != graph_id):
        raise InvalidRequest(
            f"no registered agent {graph_id or assistant!r}", field="metadata"
        )
    return resolved.name


class ThreadCreateView(ProtocolView):
    def post(self, request):
        body = validated(ThreadCreate, request.data)
        metadata = dict(body["metadata"])
        agent = _agent_of(metadata)
        thread_id = body.get("thread_id") or str(uuid.uuid4())
        try:
            thread = services.thread_create(
                tenant=request.principal.tenant,
                agent=agent,
                actor=actor_for(request),
                thread_id=thread_id,
                metadata=metadata,
            )
        except StateConflict as conflict:
            if body["if_exists"] != "do_nothing" or conflict.get_codes() != (
                "thread_exists"
            ):
                raise
            return Response(_thread_body(request, self.thread(thread_id)))
        return Response(shapes.thread_of(thread))


def filtered_threads(request, body: dict):
    """The tenant's threads matching a search's metadata and status."""
    threads = Thread.objects.for_tenant(request.principal.tenant).select_related(
        "tenant"
    )
    for key, value in (body.get("metadata") or {}).items():
        if key == "graph_id":
            threads = threads.filter(agent_name=value)
        elif key == "assistant_id":
            resolved = catalog.resolve(str(value))
            if resolved is None:
                return threads.none()
            threads = threads.filter(agent_name=resolved.name)
            if resolved.version:
                threads = threads.filter(agent_version=resolved.version)
        elif not METADATA_KEY_RE.fullmatch(key) or "__" in key:
            raise InvalidRequest(f"{key!r} is not a metadata key", field="metadata")
        elif isinstance(value, dict | list):
            raise InvalidRequest(
                f"metadata.{key}: only plain values are matched", field="metadata"
            )
        else:
            threads = threads.filter(**{f"metadata__{key}": value})
    if body.get("status"):
        threads = threads.filter(status=shapes.THREAD_STATUS_FROM_SDK[body["status"]])
    return threads


class ThreadSearchView(ProtocolView):
    read_methods = ("POST",)

    def post(self, request):
        body = validated(ThreadSearch, request.data)
        threads = filtered_threads(request, body)
        if body.get("ids"):
            threads = threads.filter(thread_id__in=body["ids"])
        order = SORT_FIELDS[body.get("sort_by") or "created_at"]
        descending = (body.get("sort_order") or "desc") == "desc"
        threads = threads.order_by(("-" if descending else "") + order, "pk")
        page = list(threads[body["offset"] : body["offset"] + body["limit"]])
        select = body.get("select")
        if not _wants_state(select):
            return Response([_selected(shapes.thread_of(t), select) for t in page])
        # One audit event for the page, naming the threads whose state it shows.
        states = services.thread_states_read(
            tenant=request.principal.tenant, threads=page, actor=actor_for(request)
        )
        return Response(
            [_selected(_searched(thread, states[thread.pk]), select) for thread in page]
        )


class ThreadCountView(ProtocolView):
    read_methods = ("POST",)

    def post(self, request):
        body = validated(ThreadFilter, request.data)
        return Response(filtered_threads(request, body).count())


class ThreadDetailView(ProtocolView):
    def get(self, request, thread_id):
        return Response(_thread_body(request, self.thread(thread_id)))

    def patch(self, request, thread_id):
        body = validated(ThreadUpdate, request.data)
        thread = services.thread_metadata_update(
            thread=self.thread(thread_id),
            metadata=body["metadata"],
            actor=actor_for(request),
        )
        if request.headers.get("Prefer") == "return=minimal":
            return no_content()
        return Response(_thread_body(request, thread))

    def delete(self, request, thread_id):
        """The same deletion as DELETE /api/v1/threads/{id}: the key is
        destroyed at once, the rows removed, the audit trail kept."""
        thread_deletion_request(thread=self.thread(thread_id), actor=actor_for(request))
        return no_content()


class ThreadCopyView(ProtocolView):
    def post(self, request, thread_id):
        copy = services.thread_copy(
            thread=self.thread(thread_id), actor=actor_for(request)
        )
        return Response(_thread_body(request, copy))


def _state_body(
    request, thread: Thread, checkpoint_id=None, subgraphs=False, select=None
):
    try:
        snapshot = _snapshot(
            request, thread, checkpoint_id=checkpoint_id, subgraphs=subgraphs
        )
    except InvalidRequest:
        raise exceptions.NotFound(
            f"Thread {thread.thread_id} has no checkpoint {checkpoint_id}."
        ) from None
    body = (
        shapes.empty_state(thread)
        if snapshot is None
        else shapes.state_of(thread, snapshot)
    )
    return _selected(body, select)


class ThreadStateView(ProtocolView):
    def get(self, request, thread_id, checkpoint_id=None):
        thread = self.thread(thread_id)
        return Response(
            _state_body(
                request,
                thread,
                checkpoint_id=checkpoint_id,
                subgraphs=query_flag(request, "subgraphs"),
                select=request.query_params.getlist("select") or None,
            )
        )

    def post(self, request, thread_id):
        """Update the state: a new checkpoint with `values` applied (as
        `as_node`), through the same service, and so the same rules of the
        approval gate and the same time_travel scope, as POST
        /api/v1/threads/{id}/fork."""
        require_time_travel(request)
        body = validated(StateUpdate, request.data)
        thread = self.thread(thread_id)
        base = checkpoint_id_of(body) or services.thread_latest_checkpoint_id(thread)
        if base is None:
            raise StateConflict(
                f"thread {thread_id} has no checkpoint yet: start a run first",
                code="no_checkpoint",
            )
        checkpoint_id = services.thread_fork(
            thread=thread,
            checkpoint_id=base,
            values=body.get("values"),
            as_node=body.get("as_node"),
            actor=actor_for(request),
        )
        thread.refresh_from_db()
        return Response(
            {
                "checkpoint": {
                    "thread_id": thread.thread_id,
                    "checkpoint_ns": "",
                    "checkpoint_id": checkpoint_id,
                    "checkpoint_map": None,
                }
            }
        )


class ThreadStateAtCheckpointView(ProtocolView):
    read_methods = ("POST",)

    def post(self, request, thread_id):
        body = validated(StateAt, request.data)
        checkpoint_id = body["checkpoint"].get("checkpoint_id")
        if not checkpoint_id:
            raise InvalidRequest("checkpoint_id is required", field="checkpoint")
        return Response(
            _state_body(
                request,
                self.thread(thread_id),
                checkpoint_id=checkpoint_id,
                subgraphs=body["subgraphs"],
                select=body.get("select"),
            )
        )


class ThreadHistoryView(ProtocolView):
    read_methods = ("POST",)

    def post(self, request, thread_id):
        body = validated(History, request.data)
        thread = self.thread(thread_id)
        snapshots = services.thread_history(
            thread=thread,
            actor=actor_for(request),
            limit=body["limit"],
            before=body.get("before"),
            metadata=body.get("metadata"),
        )
        select = body.get("select")
        return Response(
            [
                _selected(shapes.state_of(thread, snapshot), select)
                for snapshot in snapshots
            ]
        )
