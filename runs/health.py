"""Liveness and readiness probes for load balancers and orchestrators."""

from django.conf import settings
from django.db import connection
from django.http import JsonResponse
from kombu import Connection


def healthz(request) -> JsonResponse:
    return JsonResponse({"status": "ok"})


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


def readyz(request) -> JsonResponse:
    checks = {"database": _check_database(), "broker": _check_broker()}
    ready = all(error is None for error in checks.values())
    body = {
        "status": "ok" if ready else "unavailable",
        "checks": {name: error or "ok" for name, error in checks.items()},
    }
    return JsonResponse(body, status=200 if ready else 503)
