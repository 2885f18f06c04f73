"""/api/v1/webhooks: a tenant's subscriptions, and their delivery log."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, generics, status
from rest_framework.response import Response
from rest_framework.views import APIView

from runs import permissions
from runs.api.idempotency import IdempotentWrites
from runs.api.views import actor_for, validated
from runs.models import Scope
from webhooks import services
from webhooks.api.serializers import (
    DeliverySerializer,
    IssuedSubscriptionSerializer,
    SubscriptionCreateSerializer,
    SubscriptionSerializer,
)
from webhooks.models import WebhookDelivery, WebhookSubscription


class SubscriptionMixin:
    required_scope = Scope.RUNS

    def subscriptions(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation
            return WebhookSubscription.objects.none()
        return WebhookSubscription.objects.for_tenant(self.request.principal.tenant)


class SubscriptionListCreateView(SubscriptionMixin, generics.ListAPIView):
    serializer_class = SubscriptionSerializer
    idempotency_exempt = (
        "the response shows the signing secret once: it is stored nowhere, not "
        "even to replay the response"
    )

    def get_queryset(self):
        return self.subscriptions()

    @extend_schema(summary="Webhook subscriptions")
    def get(self, request, *args, **kwargs):
        return super().get(request, *args, **kwargs)

    @extend_schema(
        request=SubscriptionCreateSerializer,
        responses={201: IssuedSubscriptionSerializer},
        summary="Subscribe an endpoint (its signing secret is shown once)",
        description="`events` may be empty: an endpoint that runs' own `webhook=` "
        "(the Agent Protocol's) may post to, on the same origin.",
    )
    def post(self, request):
        body = validated(SubscriptionCreateSerializer, request)
        if body["include_content"] and not permissions.can(
            request.principal, permissions.READ_STATE
        ):
            raise exceptions.PermissionDenied(services.CONTENT_REFUSED)
        issued = services.subscription_create(
            tenant=request.principal.tenant,
            url=body["url"],
            events_wanted=body["events"],
            include_content=body["include_content"],
            actor=actor_for(request),
        )
        data = SubscriptionSerializer(issued.subscription).data
        response = Response(
            {**data, "secret": issued.secret}, status=status.HTTP_201_CREATED
        )
        response["Cache-Control"] = "no-store"
        return response


class SubscriptionDetailView(SubscriptionMixin, IdempotentWrites, APIView):
    def get_object(self, subscription_id):
        return generics.get_object_or_404(self.subscriptions(), pk=subscription_id)

    @extend_schema(responses=SubscriptionSerializer, summary="A webhook subscription")
    def get(self, request, subscription_id):
        return Response(SubscriptionSerializer(self.get_object(subscription_id)).data)

    @extend_schema(responses={204: None}, summary="Delete a webhook subscription")
    def delete(self, request, subscription_id):
        services.subscription_delete(
            subscription=self.get_object(subscription_id), actor=actor_for(request)
        )
        return Response(status=status.HTTP_204_NO_CONTENT)


class DeliveryListView(SubscriptionMixin, generics.ListAPIView):
    serializer_class = DeliverySerializer

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return WebhookDelivery.objects.none()
        subscription = generics.get_object_or_404(
            self.subscriptions(), pk=self.kwargs["subscription_id"]
        )
        return WebhookDelivery.objects.filter(subscription=subscription)

    @extend_schema(summary="The delivery log of a subscription, newest first")
    def get(self, request, *args, **kwargs):
        return super().get(request, *args, **kwargs)
