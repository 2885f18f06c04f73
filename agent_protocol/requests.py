"""The request bodies the pinned langgraph-sdk sends, validated.

Fields a LangGraph server accepts but Gatehouse does not honour are refused
with a 400 that says why (docs/langgraph-clients.md lists them), never
silently ignored: a client that asked for a schedule or a different
durability must not believe it got one.
"""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from runs.api.fields import StrictBooleanField
from runs.api.serializers import body_validated
from runs.errors import InvalidRequest
from runs.models import Run

MAX_PAGE = 1000

# The SDK's stream modes -> LangGraph's (what the worker publishes).
STREAM_MODES = {
    "values": "values",
    "updates": "updates",
    "messages-tuple": "messages",
    "custom": "custom",
    "debug": "debug",
    "tasks": "tasks",
    "checkpoints": "checkpoints",
}
# Modes with no counterpart: LangChain's callback events and the legacy
# message-accumulating mode need the server to run the graph itself.
REFUSED_MODES = {
    "events": "use messages-tuple for tokens, custom for your own events",
    "messages": "use messages-tuple (LangGraph's messages stream mode)",
    "tools": "use custom events from the tools",
    "lifecycle": "use debug or tasks",
}


class AnyJSON(serializers.JSONField):
    """Any JSON value, null included."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("required", False)
        kwargs.setdefault("allow_null", True)
        super().__init__(**kwargs)


class Page(serializers.Serializer):
    limit = serializers.IntegerField(min_value=1, max_value=MAX_PAGE, default=10)
    offset = serializers.IntegerField(min_value=0, default=0)
    sort_order = serializers.ChoiceField(["asc", "desc"], required=False)
    select = serializers.ListField(child=serializers.CharField(), required=False)


class AssistantSearch(Page):
    metadata = serializers.DictField(required=False)
    graph_id = serializers.CharField(required=False)
    name = serializers.CharField(required=False)
    sort_by = serializers.ChoiceField(
        ["assistant_id", "graph_id", "name", "created_at", "updated_at"],
        required=False,
    )


class AssistantCount(serializers.Serializer):
    metadata = serializers.DictField(required=False)
    graph_id = serializers.CharField(required=False)
    name = serializers.CharField(required=False)


class ThreadCreate(serializers.Serializer):
    thread_id = serializers.CharField(required=False)
    metadata = serializers.DictField(required=False, default=dict)
    if_exists = serializers.ChoiceField(["raise", "do_nothing"], default="raise")
    supersteps = AnyJSON()
    ttl = AnyJSON()

    def validate(self, attrs):
        if attrs.get("supersteps"):
            raise InvalidRequest(
                "seeding a thread with supersteps is not supported: start a run, "
                "or update its state once it has one",
                field="supersteps",
            )
        if attrs.get("ttl") is not None:
            refuse_ttl()
        return attrs


def refuse_ttl():
    raise InvalidRequest(
        "a thread's time to live is its tenant's retention policy, not a "
        "per-thread setting",
        field="ttl",
    )


class ThreadUpdate(serializers.Serializer):
    metadata = serializers.DictField()
    ttl = AnyJSON()

    def validate(self, attrs):
        if attrs.get("ttl") is not None:
            refuse_ttl()
        return attrs


class ThreadFilter(serializers.Serializer):
    metadata = serializers.DictField(required=False)
    values = AnyJSON()
    status = serializers.ChoiceField(
        ["idle", "busy", "interrupted", "error"], required=False
    )

    def validate(self, attrs):
        if attrs.get("values"):
            raise InvalidRequest(
                "threads cannot be searched by their values: a thread's state is "
                "encrypted; tag threads with metadata the agent declares safe",
                field="values",
            )
        return attrs


class ThreadSearch(ThreadFilter, Page):
    # Bounded like a page: each id is a parameter of the search's statement,
    # and a statement takes at most 65535 (config.postgresql).
    ids = serializers.ListField(
        child=serializers.CharField(), required=False, max_length=MAX_PAGE
    )
    sort_by = serializers.ChoiceField(
        ["thread_id", "status", "created_at", "updated_at", "state_updated_at"],
        required=False,
    )
    extract = AnyJSON()

    def validate(self, attrs):
        attrs = super().validate(attrs)
        if attrs.get("extract"):
            raise InvalidRequest(
                "extract is not supported: select whole values", field="extract"
            )
        return attrs


class CheckpointRef(serializers.Serializer):
    thread_id = serializers.CharField(required=False)
    checkpoint_ns = serializers.CharField(required=False, allow_blank=True)
    checkpoint_id = serializers.CharField(required=False, allow_null=True)
    checkpoint_map = AnyJSON()

    def validate(self, attrs):
        if attrs.get("checkpoint_ns"):
            raise InvalidRequest(
                "only the root graph's checkpoints (checkpoint_ns '') are addressed",
                field="checkpoint",
            )
        return attrs


def checkpoint_id_of(body: dict) -> str | None:
    """`checkpoint_id`, or the id inside `checkpoint`."""
    return body.get("checkpoint_id") or (body.get("checkpoint") or {}).get(
        "checkpoint_id"
    )


class StateAt(serializers.Serializer):
    checkpoint = CheckpointRef()
    subgraphs = StrictBooleanField(default=False)
    select = serializers.ListField(child=serializers.CharField(), required=False)


class StateUpdate(serializers.Serializer):
    values = AnyJSON()
    as_node = serializers.CharField(required=False)
    checkpoint_id = serializers.CharField(required=False)
    checkpoint = CheckpointRef(required=False)

    def validate(self, attrs):
        values = attrs.get("values")
        if values is not None and not isinstance(values, dict):
            raise InvalidRequest(
                "values must be one update (an object) or null", field="values"
            )
        return attrs


class History(serializers.Serializer):
    limit = serializers.IntegerField(min_value=1, max_value=MAX_PAGE, default=10)
    before = AnyJSON()
    metadata = serializers.DictField(required=False)
    checkpoint = CheckpointRef(required=False)
    select = serializers.ListField(child=serializers.CharField(), required=False)

    def validate(self, attrs):
        before = attrs.get("before")
        if isinstance(before, dict):
            attrs["before"] = before.get("checkpoint_id")
        elif before is not None and not isinstance(before, str):
            raise InvalidRequest(
                "before is a checkpoint id or a checkpoint", field="before"
            )
        if checkpoint_id_of(attrs):
            raise InvalidRequest(
                "history starts from the latest checkpoint: use before",
                field="checkpoint",
            )
        return attrs


class Command(serializers.Serializer):
    resume = AnyJSON()
    update = AnyJSON()
    goto = AnyJSON()

    def validate(self, attrs):
        for name in ("update", "goto"):
            if attrs.get(name) is not None:
                raise InvalidRequest(
                    f"Command({name}=...) is not supported: resume an interrupt "
                    "with Command(resume=...), or update the state",
                    field="command",
                )
        if "resume" not in attrs:
            raise InvalidRequest("a command needs resume", field="command")
        return attrs


def _refuse(field: str, why: str):
    raise InvalidRequest(why, field=field)


class RunCreate(serializers.Serializer):
    assistant_id = serializers.CharField()
    input = AnyJSON()
    command = Command(required=False, allow_null=True)
    stream_mode = AnyJSON()
    stream_subgraphs = StrictBooleanField(default=False)
    stream_resumable = StrictBooleanField(default=False)
    metadata = serializers.DictField(required=False, allow_null=True)
    config = AnyJSON()
    context = AnyJSON()
    checkpoint = CheckpointRef(required=False, allow_null=True)
    checkpoint_id = serializers.CharField(required=False, allow_null=True)
    checkpoint_during = StrictBooleanField(required=False, allow_null=True)
    interrupt_before = AnyJSON()
    interrupt_after = AnyJSON()
    feedback_keys = AnyJSON()
    webhook = serializers.CharField(required=False, allow_null=True)
    multitask_strategy = serializers.ChoiceField(
        Run.Multitask.values, default=Run.Multitask.REJECT
    )
    if_not_exists = serializers.ChoiceField(["create", "reject"], default="reject")
    on_disconnect = serializers.ChoiceField(["cancel", "continue"], required=False)
    on_completion = serializers.ChoiceField(["delete", "keep"], required=False)
    after_seconds = serializers.IntegerField(required=False, allow_null=True)
    durability = serializers.ChoiceField(
        ["sync", "async", "exit"], required=False, allow_null=True
    )
    strict_resume = StrictBooleanField(required=False, allow_null=True)
    langsmith_tracer = AnyJSON()

    def validate(self, attrs):
        if attrs.get("input") is not None and attrs.get("command"):
            _refuse("command", "send either input or a command, not both")
        if attrs.get("input") is not None and not isinstance(attrs["input"], dict):
            _refuse("input", "input is an object")
        for name in ("interrupt_before", "interrupt_after"):
            if attrs.get(name):
                _refuse(
                    name,
                    "breakpoints are not supported: an agent stops for a person "
                    "with interrupt(), which Gatehouse records and gates",
                )
        if attrs.get("after_seconds"):
            _refuse("after_seconds", "delayed runs are not supported")
        if attrs.get("config") or attrs.get("context"):
            _refuse(
                "config" if attrs.get("config") else "context",
                "per-run config and context are not supported: an agent version "
                "is its configuration (register another version instead)",
            )
        if attrs.get("durability") not in (None, "sync") or (
            attrs.get("checkpoint_during") is False
        ):
            _refuse(
                "durability",
                "every run checkpoints each step before the next one (sync)",
            )
        if attrs.get("feedback_keys"):
            _refuse("feedback_keys", "LangSmith feedback is not supported")
        if attrs.get("langsmith_tracer"):
            _refuse("langsmith_tracer", "LangSmith tracing is not supported")
        attrs["stream_modes"] = stream_modes(attrs.get("stream_mode"))
        return attrs


def stream_modes(requested: Any, *, default: tuple = ("values",)) -> tuple[str, ...]:
    """The SDK's `stream_mode` (one or a list) as LangGraph's modes."""
    if requested is None:
        requested = list(default)
    if isinstance(requested, str):
        requested = [requested]
    if not isinstance(requested, list) or not all(
        isinstance(mode, str) for mode in requested
    ):
        _refuse("stream_mode", "stream_mode is a mode or a list of modes")
    modes = []
    for mode in requested:
        if mode in REFUSED_MODES:
            _refuse(
                "stream_mode",
                f"stream mode {mode!r} is not supported: {REFUSED_MODES[mode]}",
            )
        if mode not in STREAM_MODES:
            _refuse(
                "stream_mode",
                f"unknown stream mode {mode!r}; supported: "
                + ", ".join(sorted(STREAM_MODES)),
            )
        modes.append(STREAM_MODES[mode])
    return tuple(sorted(set(modes)))


class RunsCancel(serializers.Serializer):
    thread_id = serializers.CharField(required=False)
    run_ids = serializers.ListField(
        child=serializers.UUIDField(), required=False, max_length=MAX_PAGE
    )
    status = serializers.ChoiceField(["pending", "running", "all"], required=False)


def validated(serializer_class, data) -> dict:
    return body_validated(serializer_class, data if data is not None else {})
