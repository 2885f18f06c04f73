from rest_framework import serializers

from approvals.models import ApprovalRequest
from approvals.plans import MAX_STEPS
from runs.api.fields import StrictBooleanField
from runs.api.serializers import RunQueuedSerializer


class PayloadSerializer(serializers.Serializer):
    action = serializers.CharField()
    args = serializers.DictField()
    reason = serializers.CharField()
    affects = serializers.CharField()
    if_denied = serializers.CharField()


class EditSerializer(serializers.Serializer):
    step = serializers.IntegerField(
        required=False, help_text="A plan's step the change is in (plan gates)."
    )
    action = serializers.CharField(
        required=False, help_text="That step's action (plan gates)."
    )
    removed = serializers.BooleanField(
        required=False,
        help_text="The step was taken out of the plan (`old` holds its args).",
    )
    arg = serializers.CharField(
        allow_null=True, help_text="The argument changed; null for a step removed."
    )
    old = serializers.JSONField()
    new = serializers.JSONField()


class DecisionSerializer(serializers.Serializer):
    reviewer = serializers.CharField(
        help_text="The principal: a username, or `key <prefix>` for a service key."
    )
    unverified_label = serializers.CharField(
        help_text="The name a service key sent as `reviewer`: never verified, "
        "never counted as a person."
    )
    via_key = serializers.CharField(
        help_text="The key the decision came through (a service key, or the "
        "user's personal key); empty for a session."
    )
    approved = serializers.BooleanField()
    note = serializers.CharField()
    args = serializers.DictField(
        allow_null=True, help_text="The edited arguments, when this decision edited."
    )
    edits = EditSerializer(many=True, help_text="What this decision changed.")
    created_at = serializers.DateTimeField()


class ApprovalSerializer(serializers.ModelSerializer):
    thread_id = serializers.CharField(source="thread.thread_id")
    run_id = serializers.UUIDField()
    payload = PayloadSerializer()
    args = serializers.DictField(
        help_text="The arguments an approval approves now: the payload's, or "
        'the latest approved edit. For a plan gate, `{"steps": [...]}`: the '
        "steps an approval approves now, each `{step, action, args, reason, "
        "affects, if_denied, risk}`."
    )
    edits = EditSerializer(
        many=True, help_text="How `args` differs from the payload's arguments."
    )
    decisions = DecisionSerializer(many=True)

    class Meta:
        model = ApprovalRequest
        fields = [
            "id",
            "thread_id",
            "run_id",
            "interrupt_id",
            "status",
            "gate",
            "risk",
            "payload",
            "args",
            "edits",
            "required_approvals",
            "decisions",
            "created_at",
            "due_at",
            "escalation_level",
        ]


class ApprovalSummarySerializer(serializers.ModelSerializer):
    """The list's rows: no decryption, so that a long queue lists fast."""

    thread_id = serializers.CharField(source="thread.thread_id")
    run_id = serializers.UUIDField()

    class Meta:
        model = ApprovalRequest
        fields = [
            "id",
            "thread_id",
            "run_id",
            "interrupt_id",
            "status",
            "gate",
            "risk",
            "action",
            "required_approvals",
            "created_at",
            "due_at",
            "escalation_level",
        ]


class PlanChangeSerializer(serializers.Serializer):
    remove = serializers.ListField(
        child=serializers.IntegerField(min_value=1),
        required=False,
        default=list,
        max_length=MAX_STEPS,
        help_text="The numbers of the steps to take out of the plan.",
    )
    args = serializers.DictField(
        child=serializers.DictField(),
        required=False,
        default=dict,
        help_text='Edited arguments by step number, `{"2": {...}}`: all of '
        "the step's arguments, validated against its action's declared schema; "
        "only editable arguments may change.",
    )


class DecideSerializer(serializers.Serializer):
    approved = StrictBooleanField(
        help_text="true approves, false denies: a JSON boolean, never a string."
    )
    note = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=2000,
        default="",
        help_text="Why: shown on the card and kept with the decision (required "
        "when `args` edits the action).",
    )
    reviewer = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=150,
        default="",
        help_text="A service key's label for whom it decides: recorded as "
        "unverified. Ignored for a session or a personal key.",
    )
    args = serializers.DictField(
        required=False,
        help_text="Approve with these arguments instead (all of them): validated "
        "against the action's declared schema; only editable arguments may "
        "change; needs a note. Action gates only.",
    )
    plan = PlanChangeSerializer(
        required=False,
        help_text="Plan gates only: approve the plan with steps removed or their "
        "arguments edited; needs a note. Removing steps cannot raise the risk; "
        "an edit can.",
    )


class DecisionResultSerializer(ApprovalSerializer):
    resumed_run = RunQueuedSerializer(allow_null=True)

    class Meta(ApprovalSerializer.Meta):
        fields = [*ApprovalSerializer.Meta.fields, "resumed_run"]
