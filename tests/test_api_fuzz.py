"""Schemathesis over the served OpenAPI: every operation, generated inputs,
a key with every scope, throttling raised: no input reaches a 500 (issue 16,
item 3).

Each example runs in a savepoint rolled back afterwards, so that examples do
not see each other's writes and a failed statement cannot poison the next.
"""

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.db import close_old_connections, transaction
from hypothesis import HealthCheck, settings

from config.wsgi import application
from tests.factories import make_api_key, make_tenant

EXAMPLES_PER_OPERATION = 20


# The schema as the application serves it (no database needed to serve it).
schema = schemathesis.openapi.from_wsgi("/api/v1/schema?format=json", application)


@pytest.fixture
def every_scope(db, settings):
    """A key with every scope, throttling out of the way, and the WSGI handler
    kept from closing the test's connection after each request (Django's test
    client does the same)."""
    settings.REST_FRAMEWORK = {
        **settings.REST_FRAMEWORK,
        "DEFAULT_THROTTLE_RATES": {"principal": "1000000/minute"},
    }
    for signal in (request_started, request_finished):
        signal.disconnect(close_old_connections)
    tenant = make_tenant()
    _, secret = make_api_key(tenant)  # every scope, time_travel included
    yield {"Authorization": f"Bearer {secret}"}
    for signal in (request_started, request_finished):
        signal.connect(close_old_connections)


@schema.parametrize()
@settings(
    max_examples=EXAMPLES_PER_OPERATION,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
def test_no_input_reaches_a_server_error(case, every_scope):
    # A generated Host header ("[", say) fails in `requests` itself, before
    # anything is sent (its cookie jar parses the URL with it); what the
    # server does with a bad Host is tested in test_service_endpoints.
    if case.headers:
        case.headers = {k: v for k, v in case.headers.items() if k.lower() != "host"}
    with transaction.atomic():
        response = case.call(headers=every_scope)
        transaction.set_rollback(True)
    seen = (
        f"{case.method} {case.formatted_path} -> {response.status_code}\n"
        f"{case.as_curl_command(headers=every_scope)}\n{response.text[:2000]}"
    )
    assert response.status_code < 500, seen
    if response.status_code >= 400:
        assert response.headers.get("content-type") == ["application/json"], seen
        assert set(response.json()) >= {"code", "message"}, seen
