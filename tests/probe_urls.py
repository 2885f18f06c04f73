"""A small write endpoint that exercises the shared API plumbing in tests.

It lets the plumbing (validation errors, Idempotency-Key, scopes) be tested
on its own, apart from any real endpoint's rules.
"""

import uuid

from django.urls import include, path
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from runs.api.idempotency import IdempotentWrites


class ProbeSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=50)
    input = serializers.DictField()


class ProbeView(IdempotentWrites, APIView):
    required_scope = "runs"

    def post(self, request):
        serializer = ProbeSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        body = {"id": str(uuid.uuid4()), "tenant": request.principal.tenant.slug}
        return Response(body, status=status.HTTP_201_CREATED)


urlpatterns = [
    path("api/v1/probe", ProbeView.as_view()),
    path("", include("config.urls")),
]
