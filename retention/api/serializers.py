from rest_framework import serializers

from retention.models import DeletionRequest


class DeletionRequestCreateSerializer(serializers.Serializer):
    """Exactly one of `subject` (a data subject's identifier, as agents tag
    threads with it) or `thread_id`."""

    subject = serializers.CharField(
        required=False, max_length=500, trim_whitespace=True
    )
    thread_id = serializers.CharField(required=False, max_length=255)

    def validate(self, attrs):
        if ("subject" in attrs) == ("thread_id" in attrs):
            raise serializers.ValidationError(
                {"subject": ["give either subject or thread_id, not both or neither"]}
            )
        return attrs


class DeletionRequestSerializer(serializers.ModelSerializer):
    thread_id = serializers.CharField(source="thread_ref")
    record = serializers.JSONField(
        help_text="What was removed: rows by kind, thread ids, threads on hold."
    )

    class Meta:
        model = DeletionRequest
        fields = [
            "id",
            "kind",
            "status",
            "thread_id",
            "requested_by",
            "created_at",
            "updated_at",
            "completed_at",
            "record",
        ]
        read_only_fields = fields
