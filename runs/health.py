"""Liveness and readiness probes for load balancers and orchestrators."""

from django.conf import settings
from django.db import connection
from drf_spectacular.utils import extend_schema, inline_serializer
from kombu import Connection
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from runs import crypto


def _check_database() -> str | None:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return None
    except Exception as exc:  # any failure means "not ready"; say which
        return type(exc).__name__


def _check_broker() -> str | None:
    try:
        with Connection(
            settings.CELERY_BROKER_URL,
            transport_options=settings.CELERY_BROKER_TRANSPORT_OPTIONS,
        ) as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
        return None
    except Exception as exc:
        return type(exc).__name__


class ProbeView(APIView):
    """Answers without credentials, throttling or a tenant."""

    public = True
    authentication_classes: list = []
    throttle_classes: list = []


class HealthView(ProbeView):
    @extend_schema(
        summary="Liveness: the process answers",
        responses=inline_serializer("Health", {"status": serializers.CharField()}),
        tags=["service"],
    )
    def get(self, request):
        return Response({"status": "ok"})


class ReadyView(ProbeView):
    @extend_schema(
        summary="Readiness: database and broker reachable (503 naming the failing check)",
        description=(
            "`warnings` lists what an operator must fix although the process is "
            "ready, such as running on the embedded mode's development master key."
        ),
        responses={
            (code, "application/json"): inline_serializer(
                f"Readiness{code}",
                {
                    "status": serializers.CharField(),
                    "checks": serializers.DictField(child=serializers.CharField()),
                    "warnings": serializers.ListField(child=serializers.CharField()),
                },
            )
            for code in (200, 503)
        },
        tags=["service"],
    )
    def get(self, request):
        checks = {"database": _check_database(), "broker": _check_broker()}
        ready = all(error is None for error in checks.values())
        body = {
            "status": "ok" if ready else "unavailable",
            "checks": {name: error or "ok" for name, error in checks.items()},
            "warnings": crypto.development_key_warnings(),
        }
        return Response(body, status=200 if ready else 503)
