from rest_framework import serializers

from approvals.models import ApprovalRequest
from runs.api.serializers import RunQueuedSerializer


class PayloadSerializer(serializers.Serializer):
    action = serializers.CharField()
    args = serializers.DictField()
    reason = serializers.CharField()
    affects = serializers.CharField()
    if_denied = serializers.CharField()


class DecisionSerializer(serializers.Serializer):
    reviewer = serializers.CharField(source="reviewer_label")
    approved = serializers.BooleanField()
    note = serializers.CharField()
    args = serializers.DictField(allow_null=True)
    created_at = serializers.DateTimeField()


class ApprovalSerializer(serializers.ModelSerializer):
    thread_id = serializers.CharField(source="thread.thread_id")
    run_id = serializers.UUIDField()
    payload = PayloadSerializer()
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


class DecideSerializer(serializers.Serializer):
    approved = serializers.BooleanField()
    note = serializers.CharField(
        required=False, allow_blank=True, max_length=2000, default=""
    )
    reviewer = serializers.CharField(
        required=False, allow_blank=True, max_length=150, default=""
    )
    args = serializers.DictField(required=False)


class DecisionResultSerializer(ApprovalSerializer):
    resumed_run = RunQueuedSerializer(allow_null=True)

    class Meta(ApprovalSerializer.Meta):
        fields = [*ApprovalSerializer.Meta.fields, "resumed_run"]
