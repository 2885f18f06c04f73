"""Health probes, the OpenAPI schema and the docs page."""

import pytest
import yaml
from django.core.management import call_command
from drf_spectacular.validation import validate_schema

from tests.factories import api_client

pytestmark = pytest.mark.django_db


def test_healthz_answers_without_credentials():
    response = api_client().get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_readyz_checks_database_and_broker():
    response = api_client().get("/readyz")
    assert response.status_code == 200
    assert response.json()["checks"] == {"database": "ok", "broker": "ok"}


def test_readyz_reports_an_unreachable_broker(settings):
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    response = api_client().get("/readyz")
    assert response.status_code == 503
    assert response.json()["checks"]["database"] == "ok"
    assert response.json()["checks"]["broker"] != "ok"


def test_schema_is_valid_openapi_3():
    response = api_client().get("/api/v1/schema", HTTP_ACCEPT="application/json")
    assert response.status_code == 200
    schema = (
        response.json()
        if response["Content-Type"].startswith("application/json")
        else yaml.safe_load(response.content)
    )
    assert schema["openapi"].startswith("3.")
    validate_schema(schema)
    for path in ["/api/v1/agents", "/api/v1/threads", "/api/v1/approvals",
                 "/api/v1/threads/{thread_id}/runs", "/healthz", "/readyz"]:
        assert path in schema["paths"], path


def test_schema_generation_has_no_warnings(capsys):
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", "/dev/null")


def test_docs_page_loads_no_third_party_assets():
    response = api_client().get("/api/v1/docs")
    assert response.status_code == 200
    html = response.content.decode()
    assert "swagger-ui" in html
    assert "cdn" not in html.lower()
    assert "https://" not in html


@pytest.mark.parametrize("method", ["options", "post", "delete"])
def test_the_docs_page_answers_only_get_and_head(method):
    """OPTIONS was DRF's metadata answer, which the page's HTML renderer has
    no template for: a 500 for anyone, no credentials needed."""
    client = api_client()
    client.raise_request_exception = False
    response = getattr(client, method)("/api/v1/docs")
    assert response.status_code == 405
    assert client.head("/api/v1/docs").status_code == 200


@pytest.mark.parametrize("host", ["", "evil.example", "["])
def test_a_refused_host_is_the_apis_json_400_under_the_apis(host):
    """Django refuses a Host header it does not allow (empty, unknown, not a
    host) before any view, through its 400 handler: under the APIs that is
    the API's error body, as every other refusal there (schemathesis sent an
    empty one and got an HTML page)."""
    client = api_client()
    for path in ("/api/v1/threads", "/langgraph/threads/search"):
        response = client.get(path, HTTP_HOST=host)
        assert response.status_code == 400, (path, response.content)
        assert response["Content-Type"] == "application/json", path
        assert response.json()["code"] == "bad_request"
    page = client.get("/admin/login/", HTTP_HOST=host)
    assert page.status_code == 400
    assert page["Content-Type"].startswith("text/html")
