from __future__ import annotations

from rest_framework import serializers

from audit import selectors
from audit.export import iso
from audit.models import AuditEvent


class ActorSerializer(serializers.Serializer):
    type = serializers.CharField(source="actor_type")
    id = serializers.CharField(source="actor_id")
    label = serializers.CharField(source="actor_label")
    on_behalf_of = serializers.CharField(source="actor_on_behalf_of")


class AuditEventSerializer(serializers.ModelSerializer):
    actor = ActorSerializer(source="*")

    def to_representation(self, instance: AuditEvent) -> dict:
        # The declared fields' shape, built directly: DRF's per-field
        # machinery costs several times the query for a busy tenant's day.
        return {
            "seq": instance.seq,
            "occurred_at": iso(instance.occurred_at),
            "kind": instance.kind,
            "actor": {
                "type": instance.actor_type,
                "id": instance.actor_id,
                "label": instance.actor_label,
                "on_behalf_of": instance.actor_on_behalf_of,
            },
            "thread_id": instance.thread_id,
            "run_id": instance.run_id,
            "action": instance.action,
            "summary": instance.summary,
            "data": instance.data,
        }

    class Meta:
        model = AuditEvent
        fields = [
            "seq",
            "occurred_at",
            "kind",
            "actor",
            "thread_id",
            "run_id",
            "action",
            "summary",
            "data",
        ]
        read_only_fields = fields


class TimelineQuerySerializer(serializers.Serializer):
    tz = serializers.CharField(
        required=False,
        max_length=64,
        help_text="IANA time zone for the story's clock times (default UTC).",
    )

    def validate_tz(self, value: str):
        try:
            return selectors.zone(value)
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from None


class TimelineEntrySerializer(serializers.Serializer):
    at = serializers.DateTimeField()
    seq = serializers.IntegerField()
    last_seq = serializers.IntegerField()
    kind = serializers.CharField()
    action = serializers.CharField()
    actor = serializers.CharField()
    text = serializers.CharField()
    count = serializers.IntegerField()


class TimelineSerializer(serializers.Serializer):
    thread_id = serializers.CharField()
    deleted = serializers.BooleanField(
        help_text="The thread was deleted; its tombstone is in the entries."
    )
    events = serializers.IntegerField(help_text="Events recorded for the thread.")
    hidden = serializers.IntegerField(
        help_text="Events of kinds that stay out of timelines (e.g. state reads)."
    )
    truncated = serializers.BooleanField()
    first_at = serializers.DateTimeField()
    last_at = serializers.DateTimeField()
    entries = TimelineEntrySerializer(many=True)
    story = serializers.ListField(child=serializers.CharField())


class VerificationSerializer(serializers.Serializer):
    ok = serializers.BooleanField()
    blocks = serializers.IntegerField()
    events = serializers.IntegerField()
    first_bad_seq = serializers.IntegerField(allow_null=True)
    unsealed = serializers.IntegerField(
        help_text="Events recorded since the last seal, checked for gaps only."
    )
    problem = serializers.CharField(allow_blank=True)
    head_seq = serializers.IntegerField(help_text="Last sealed sequence number.")
    head_hash = serializers.CharField(
        allow_blank=True, help_text="Seal of the last block (HMAC under the audit key)."
    )
    against_seq = serializers.IntegerField(
        allow_null=True,
        help_text="The saved head the chain was checked against, if one was given.",
    )
    checked_at = serializers.DateTimeField()


class SignedHeadSerializer(serializers.Serializer):
    """The end of the tenant's sealed chain, signed: keep it where the
    database's administrators cannot write, and hand it back to
    `POST /audit/verify` later."""

    tenant_id = serializers.IntegerField()
    tenant = serializers.CharField()
    head_seq = serializers.IntegerField(help_text="Last sealed sequence number.")
    head_hash = serializers.CharField(help_text="Seal of the block ending there.")
    signed_at = serializers.CharField(
        help_text="When the head was signed, YYYY-MM-DDTHH:MM:SS.ffffffZ."
    )
    key_id = serializers.CharField(help_text="The audit key that signed it.")
    signature = serializers.CharField(help_text="HMAC-SHA256 over the fields above.")


class VerifyAgainstSerializer(serializers.Serializer):
    against = SignedHeadSerializer(
        help_text="A head saved earlier from GET /audit/head or audit_anchor."
    )
