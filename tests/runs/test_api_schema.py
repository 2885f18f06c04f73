"""The API's documentation: every operation lists the errors it can answer
with the one error body; request fields, parameters and integers carry
descriptions and sane examples. And booleans are JSON booleans, everywhere."""

import re

import pytest
from drf_spectacular.generators import SchemaGenerator

from runs.api.errors import _DEFAULT_CODES, PayloadTooLarge, ServiceUnavailable
from runs.api.schema import ERRORS
from tests.approvals.helpers import waiting_request
from tests.factories import tenant_with_client

ERROR_REF = "#/components/schemas/Error"


@pytest.fixture(scope="module")
def schema():
    return SchemaGenerator().get_schema(request=None, public=True)


def operations(schema):
    for path, methods in schema["paths"].items():
        for method, operation in methods.items():
            yield path, method.upper(), operation


def test_every_operation_lists_the_errors_it_can_answer(schema):
    checked = 0
    for path, method, operation in operations(schema):
        if not path.startswith("/api/v1/"):
            continue
        expected = {"401", "403", "429", "503"}
        if "{" in path:
            expected.add("404")
        if "requestBody" in operation:
            expected |= {"400", "413", "415"}
        if method == "POST" and path == "/api/v1/threads":
            expected.add("409")  # the thread id exists, or an Idempotency-Key reused
        assert expected <= set(operation["responses"]), (method, path)
        for code, response in operation["responses"].items():
            if code.startswith(("4", "503")):
                body = response["content"]["application/json"]["schema"]
                refs = [body.get("$ref")] + [
                    part.get("$ref") for part in body.get("allOf", [])
                ]
                assert any(ref and ref.endswith(("/Error", "/ApprovalRequired"))
                           for ref in refs), (method, path, code)  # fmt: skip
                assert response["description"], (method, path, code)
        assert "Retry-After" in operation["responses"]["429"]["headers"]
        assert "Retry-After" in operation["responses"]["503"]["headers"]
        checked += 1
    assert checked > 25
    error = schema["components"]["schemas"]["Error"]
    assert set(error["properties"]) == {"code", "message", "fields"}


def _within(prop: dict, example) -> bool:
    low, high = prop.get("minimum", float("-inf")), prop.get("maximum", float("inf"))
    return low <= example <= high


def test_request_fields_parameters_and_integers_are_documented(schema):
    missing = []
    for name, component in schema["components"]["schemas"].items():
        for field, prop in component.get("properties", {}).items():
            where = f"{name}.{field}"
            if prop.get("type") == "integer":
                if "example" not in prop or not _within(prop, prop["example"]):
                    missing.append(f"{where}: integer example")
            is_request = name.endswith("Request") and name != "DeletionRequest"
            if is_request and not prop.get("readOnly"):
                if not prop.get("description"):
                    missing.append(f"{where}: description")
                typed = "type" in prop or "enum" in prop
                if typed and "example" not in prop and "enum" not in prop:
                    missing.append(f"{where}: example")
    for path, method, operation in operations(schema):
        for parameter in operation.get("parameters", []):
            where = f"{method} {path} ?{parameter['name']}"
            if not parameter.get("description"):
                missing.append(f"{where}: description")
            kind = parameter["schema"]
            if "enum" not in kind and "example" not in kind:
                missing.append(f"{where}: example")
            if kind.get("type") == "integer" and "example" in kind:
                assert _within(kind, kind["example"]), where
    assert not missing, "\n".join(missing)


@pytest.mark.django_db
@pytest.mark.parametrize("value", ["yes", "true", 1, 0, "on", None])
def test_a_decision_takes_only_a_json_boolean(value):
    tenant, client = tenant_with_client(scopes=["approvals"])
    approval = waiting_request(tenant)
    response = client.post(
        f"/api/v1/approvals/{approval.pk}/decision",
        {"approved": value, "note": "checked"},
        format="json",
    )
    assert response.status_code == 400, response.content
    assert "approved" in response.json()["fields"]
    approval.refresh_from_db()
    assert approval.status == "pending"


@pytest.mark.django_db
def test_webhook_flags_take_only_a_json_boolean():
    _, client = tenant_with_client(scopes=["runs"])
    response = client.post(
        "/api/v1/webhooks",
        {
            "url": "https://hooks.example.com/x",
            "events": ["run.finished"],
            "include_content": "yes",
        },  # fmt: skip
        format="json",
    )
    assert response.status_code == 400
    assert "include_content" in response.json()["fields"]


@pytest.mark.django_db
def test_agent_protocol_flags_are_true_or_false():
    _, client = tenant_with_client(scopes=["runs"])
    created = client.post(
        "/langgraph/threads", {"metadata": {"graph_id": "refund"}}, format="json"
    )
    assert created.status_code == 200, created.content
    thread_id = created.json()["thread_id"]
    url = f"/langgraph/threads/{thread_id}/state"
    assert client.get(url, {"subgraphs": "false"}).status_code == 200
    refused = client.get(url, {"subgraphs": "yes"})
    assert refused.status_code == 400 and "subgraphs" in refused.json()["fields"]


def test_the_error_codes_the_docs_name_are_the_codes_answered():
    named = {
        code
        for text in ERRORS.values()
        for code in re.findall(r"`([a-z]+(?:_[a-z]+)+|invalid|throttled)`", text)
    }
    answered = set(_DEFAULT_CODES.values()) | {
        PayloadTooLarge("x").get_codes(),
        ServiceUnavailable().get_codes(),
        "idempotency_key_reused",
        "idempotency_in_progress",
    }
    assert named <= answered, named - answered
