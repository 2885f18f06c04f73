from rest_framework import serializers
from rest_framework.fields import empty

from runs import selectors
from runs.models import Run, Thread


class ErrorSerializer(serializers.Serializer):
    """Every error's body (runs.api.errors)."""

    code = serializers.CharField()
    message = serializers.CharField()
    fields = serializers.DictField(
        required=False, help_text="Validation errors only: the field names."
    )


class ApprovalRequiredSerializer(ErrorSerializer):
    """409 `approval_required`: the change would pass an approval gate without
    a decision. Other 409 codes have the plain error body."""

    pending_approvals = serializers.ListField(
        child=serializers.UUIDField(),
        help_text="The approval requests open on the thread that must be decided "
        "(POST /api/v1/approvals/{id}/decision); empty when the change is refused "
        "for writing past a gate.",
    )


class AgentSerializer(serializers.Serializer):
    name = serializers.CharField()
    version = serializers.CharField()
    description = serializers.CharField()
    draining = serializers.BooleanField()
    threads_in_flight = serializers.IntegerField(
        help_text="Threads of this version that are running or waiting on an interrupt."
    )


class ThreadCreateSerializer(serializers.Serializer):
    thread_id = serializers.CharField(required=False, max_length=255)
    agent = serializers.CharField(max_length=100)
    metadata = serializers.DictField(required=False, default=dict)


# One instance of each answer's serializer per process and context (`represent`).
_SHARED: dict[tuple, serializers.BaseSerializer] = {}


def represent(serializer_class, instance, *, many: bool = False, **context):
    """`serializer_class(instance, many=many, context=context).data`, by one
    instance of the serializer per process and context. Instantiating one
    builds its fields anew (deep copies; a ModelSerializer also reads its
    model's): ~10 % of a decision's web CPU, ~140 us for a run's. to_representation
    keeps nothing on the instance, so requests share it: only for serializers
    whose context is a few plain values (`context`: one instance for each
    combination, so a bool or a small set of choices), never a request."""
    key = (serializer_class, many, *sorted(context.items()))
    shared = _SHARED.get(key)
    if shared is None:
        shared = _SHARED.setdefault(key, serializer_class(many=many, context=context))
    return shared.to_representation(instance)


# Idle instances of each request body's serializer (`body_validated`).
_IDLE: dict[type, list[serializers.Serializer]] = {}


def body_validated(serializer_class, data) -> dict:
    """`serializer_class(data=data)`'s validated data, or its ValidationError.

    Instantiating a serializer builds its fields anew (a deep copy of each
    declared field), most of what checking a small body costs (~45 us of
    ~55 for a run's start, ~310 of ~360 for the Agent Protocol's), while
    checking one keeps nothing of it on the fields: so an instance, once
    done, checks the next body. Each instance serves one request at a time
    (taken from the idle ones, given back after). Only for serializers
    without context; a field default that is a mutable value (not a
    callable) would be shared by the bodies, so refused when the first
    instance is made."""
    idle = _IDLE.setdefault(serializer_class, [])
    try:
        body = idle.pop()
    except IndexError:
        body = serializer_class(data=data)
        _refuse_shared_defaults(serializer_class, body.fields.values())
    else:
        body.initial_data = data
    try:
        if not body.is_valid():
            # A plain copy: DRF's own raise would carry a ReturnDict whose
            # `.serializer` is this instance, by then checking another
            # request's body (the browsable API's renderer reads it).
            raise serializers.ValidationError(_plain(body.errors))
        return body.validated_data
    finally:
        # What is_valid and its properties leave: nothing of the body stays.
        for name in ("initial_data", "_validated_data", "_errors", "_data"):
            body.__dict__.pop(name, None)
        idle.append(body)


def _plain(errors):
    """Errors as plain dicts and lists, their ErrorDetails (messages and
    codes) as they are."""
    if isinstance(errors, dict):
        return {key: _plain(value) for key, value in errors.items()}
    if isinstance(errors, list):
        return [_plain(value) for value in errors]
    return errors


def _refuse_shared_defaults(serializer_class, fields) -> None:
    for field in fields:
        default = field.default
        if default is not empty and isinstance(default, dict | list | set):
            raise TypeError(
                f"{serializer_class.__name__}.{field.field_name}: a mutable "
                "default would be shared by every body; use a callable"
            )
        if isinstance(field, serializers.Serializer):
            _refuse_shared_defaults(serializer_class, field.fields.values())
        child = getattr(field, "child", None)
        if child is not None:
            _refuse_shared_defaults(serializer_class, [child])


class ThreadSerializer(serializers.ModelSerializer):
    agent = serializers.CharField(source="agent_name")

    class Meta:
        model = Thread
        fields = [
            "thread_id",
            "agent",
            "agent_version",
            "status",
            "created_at",
            "updated_at",
            "metadata",
        ]


class InterruptSerializer(serializers.Serializer):
    id = serializers.CharField()
    value = serializers.JSONField()


class ThreadDetailSerializer(ThreadSerializer):
    interrupts = InterruptSerializer(
        many=True,
        required=False,
        help_text="The open interrupts' values; absent for callers without "
        "the threads.read_state permission (tenant admins).",
    )
    pending_approvals = serializers.ListField(child=serializers.UUIDField())

    class Meta(ThreadSerializer.Meta):
        fields = [*ThreadSerializer.Meta.fields, "interrupts", "pending_approvals"]


class RunCreateSerializer(serializers.Serializer):
    input = serializers.DictField()
    checkpoint_id = serializers.CharField(required=False, max_length=64)


class ResumeSerializer(serializers.Serializer):
    resume = serializers.JSONField(
        help_text="The resume value, or {interrupt id: value, ...} for several interrupts."
    )


class RunSerializer(serializers.ModelSerializer):
    run_id = serializers.UUIDField(source="id")
    error = serializers.SerializerMethodField()
    compensation = serializers.SerializerMethodField(
        help_text="A failed run of a saga: `compensating` while it undoes its "
        "completed steps, then `compensated` (all undone; the thread is idle) "
        "or `failed` (a step could not be undone; the thread is in error). "
        "Null when the run had nothing to undo."
    )

    class Meta:
        model = Run
        fields = [
            "run_id",
            "kind",
            "status",
            "created_at",
            "started_at",
            "ended_at",
            "error",
            "compensation",
        ]

    def get_error(self, run: Run) -> str | None:
        if run.error is not None and not self.context.get("reveal_errors", True):
            return f"{run.error_type or 'error'} ({selectors.WITHHELD})"
        return selectors.run_error_text(run)

    def get_compensation(self, run: Run) -> str | None:
        return run.compensation or None


class RunQueuedSerializer(serializers.Serializer):
    run_id = serializers.UUIDField()
    status = serializers.CharField()


class StateSerializer(serializers.Serializer):
    checkpoint_id = serializers.CharField()
    parent_checkpoint_id = serializers.CharField(allow_null=True)
    values = serializers.JSONField()
    next = serializers.ListField(child=serializers.CharField())
    interrupts = InterruptSerializer(many=True)
    metadata = serializers.JSONField()
    created_at = serializers.DateTimeField()


class HistoryEntrySerializer(serializers.Serializer):
    checkpoint_id = serializers.CharField()
    parent_checkpoint_id = serializers.CharField(allow_null=True)
    step = serializers.IntegerField(allow_null=True)
    source = serializers.CharField(allow_null=True)
    next = serializers.ListField(child=serializers.CharField())
    created_at = serializers.DateTimeField()


class ForkSerializer(serializers.Serializer):
    checkpoint_id = serializers.CharField(max_length=64)
    values = serializers.DictField()
    as_node = serializers.CharField(required=False, max_length=100)


class ForkResultSerializer(serializers.Serializer):
    checkpoint_id = serializers.CharField()
