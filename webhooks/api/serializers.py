from rest_framework import serializers

from runs.api.fields import StrictBooleanField
from webhooks.models import EVENTS, WebhookDelivery, WebhookSubscription


class SubscriptionCreateSerializer(serializers.Serializer):
    url = serializers.URLField(max_length=2000)
    events = serializers.ListField(
        child=serializers.ChoiceField(EVENTS), allow_empty=True
    )
    include_content = StrictBooleanField(default=False)


class SubscriptionSerializer(serializers.ModelSerializer):
    class Meta:
        model = WebhookSubscription
        fields = ["id", "url", "events", "include_content", "created_at"]


class IssuedSubscriptionSerializer(SubscriptionSerializer):
    secret = serializers.CharField(
        help_text="The signing secret (Standard Webhooks, whsec_...): shown once."
    )

    class Meta(SubscriptionSerializer.Meta):
        fields = [*SubscriptionSerializer.Meta.fields, "secret"]


class DeliverySerializer(serializers.ModelSerializer):
    class Meta:
        model = WebhookDelivery
        fields = [
            "id",
            "event_type",
            "target",
            "status",
            "attempts",
            "last_status_code",
            "last_error",
            "created_at",
            "delivered_at",
            "next_attempt_at",
        ]
