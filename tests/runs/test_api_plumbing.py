"""The API plumbing every endpoint shares: errors, auth, scopes, limits, idempotency."""

import hashlib
import json

import pytest
from django.test import override_settings

from audit.services import Actor
from runs import services
from runs.models import IdempotencyRecord
from tests.approvals.helpers import waiting_request
from tests.factories import (
    api_client,
    make_api_key,
    make_member,
    make_tenant,
    tenant_with_client,
)

pytestmark = pytest.mark.django_db
probe_urls = pytest.mark.urls("tests.probe_urls")


def assert_error(response, status: int, code: str) -> dict:
    assert response.status_code == status, response.content
    body = response.json()
    assert body["code"] == code
    assert isinstance(body["message"], str) and body["message"]
    return body


def test_missing_key_is_401_with_error_body():
    response = api_client().get("/api/v1/agents")
    assert_error(response, 401, "not_authenticated")
    assert response["WWW-Authenticate"] == "Bearer"


def test_unknown_key_is_401():
    response = api_client("gh_doesnotexist.secret").get("/api/v1/agents")
    assert_error(response, 401, "authentication_failed")


def test_malformed_authorization_header_is_401():
    response = api_client("no-dot-in-this-key").get("/api/v1/agents")
    assert_error(response, 401, "authentication_failed")


def test_wrong_secret_for_existing_prefix_is_401():
    tenant = make_tenant()
    api_key, secret = make_api_key(tenant)
    response = api_client(f"{api_key.prefix}.not-the-secret").get("/api/v1/agents")
    assert_error(response, 401, "authentication_failed")


def test_revoked_key_is_401():
    tenant = make_tenant()
    api_key, secret = make_api_key(tenant)
    client = api_client(secret)
    assert client.get("/api/v1/agents").status_code == 200
    services.api_key_revoke(api_key=api_key, actor=Actor.system("tests"))
    assert_error(client.get("/api/v1/agents"), 401, "authentication_failed")


def test_missing_scope_is_403():
    _, client = tenant_with_client(scopes=["audit"])
    assert_error(client.get("/api/v1/agents"), 403, "permission_denied")


def test_unknown_api_route_is_json_404():
    _, client = tenant_with_client()
    assert_error(client.get("/api/v1/no-such-thing"), 404, "not_found")
    assert_error(client.post("/api/v2/agents", {}, format="json"), 404, "not_found")


def test_wrong_method_is_405_with_error_body():
    _, client = tenant_with_client()
    assert_error(client.delete("/api/v1/agents"), 405, "method_not_allowed")


@probe_urls
def test_malformed_json_is_400():
    _, client = tenant_with_client()
    response = client.post(
        "/api/v1/probe", data="{not json", content_type="application/json"
    )
    assert_error(response, 400, "parse_error")


@probe_urls
def test_wrong_content_type_is_415():
    _, client = tenant_with_client()
    response = client.post("/api/v1/probe", data="name=x", content_type="text/plain")
    assert_error(response, 415, "unsupported_media_type")


@probe_urls
def test_field_of_wrong_type_names_the_field():
    _, client = tenant_with_client()
    response = client.post(
        "/api/v1/probe", {"name": "x", "input": "not an object"}, format="json"
    )
    body = assert_error(response, 400, "invalid")
    assert "input" in body["fields"]


@probe_urls
def test_json_array_body_is_400_not_500():
    _, client = tenant_with_client()
    response = client.post(
        "/api/v1/probe", data="[1,2]", content_type="application/json"
    )
    assert_error(response, 400, "invalid")


@probe_urls
@override_settings(GATEHOUSE_MAX_BODY_BYTES=1000)
def test_oversized_body_is_413():
    _, client = tenant_with_client()
    payload = json.dumps({"name": "x", "input": {"blob": "a" * 2000}})
    response = client.post(
        "/api/v1/probe", data=payload, content_type="application/json"
    )
    assert_error(response, 413, "payload_too_large")


@probe_urls
def test_idempotency_key_replays_first_response():
    _, client = tenant_with_client()
    body = {"name": "x", "input": {"a": 1}}
    first = client.post(
        "/api/v1/probe", body, format="json", HTTP_IDEMPOTENCY_KEY="k-1"
    )
    second = client.post(
        "/api/v1/probe", body, format="json", HTTP_IDEMPOTENCY_KEY="k-1"
    )
    assert first.status_code == second.status_code == 201
    assert first.json() == second.json()
    assert second["Idempotent-Replayed"] == "true"
    third = client.post(
        "/api/v1/probe", body, format="json", HTTP_IDEMPOTENCY_KEY="k-2"
    )
    assert third.json()["id"] != first.json()["id"]


@probe_urls
def test_idempotency_key_with_another_body_is_409():
    _, client = tenant_with_client()
    client.post(
        "/api/v1/probe",
        {"name": "x", "input": {}},
        format="json",
        HTTP_IDEMPOTENCY_KEY="k-1",
    )
    response = client.post(
        "/api/v1/probe",
        {"name": "y", "input": {}},
        format="json",
        HTTP_IDEMPOTENCY_KEY="k-1",
    )
    assert_error(response, 409, "idempotency_key_reused")


@probe_urls
def test_another_key_of_the_tenant_does_not_get_the_first_keys_response():
    """Issue 16, finding 8: records were per tenant, so a second key replayed
    the first one's response."""
    tenant, first_client = tenant_with_client()
    _, secret = make_api_key(tenant, ["runs"], name="second")
    body = {"name": "x", "input": {"a": 1}}
    first = first_client.post(
        "/api/v1/probe", body, format="json", HTTP_IDEMPOTENCY_KEY="k-1"
    )
    second = api_client(secret).post(
        "/api/v1/probe", body, format="json", HTTP_IDEMPOTENCY_KEY="k-1"
    )
    assert first.status_code == second.status_code == 201
    assert "Idempotent-Replayed" not in second
    assert second.json()["id"] != first.json()["id"]


@probe_urls
def test_the_stored_request_digest_is_keyed_not_a_bare_hash():
    """Issue 16, finding 8: a bare SHA-256 of the body gave a deletion
    request's e-mail away to a dictionary of candidates."""
    _, client = tenant_with_client()
    body = {"name": "x", "input": {"email": "rita@example.com"}}
    client.post("/api/v1/probe", body, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    stored = IdempotencyRecord.objects.get(key="k-1").request_digest
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    candidate = f"POST\n/api/v1/probe\n{canonical}".encode()
    assert stored != hashlib.sha256(candidate).hexdigest()
    assert "rita" not in stored and len(stored) == 64


def test_a_stored_response_is_sealed_and_opens_only_in_its_record():
    """A decision's answer shows the request's payload and the reviewer's
    note: stored to be replayed, it is never in clear in the database, and
    copied to another record it does not open there."""
    tenant, client = tenant_with_client()
    approval = waiting_request(tenant)
    path = f"/api/v1/approvals/{approval.pk}/decision"
    body = {"approved": False, "note": "rita@example.com asked twice"}
    first = client.post(path, body, format="json", HTTP_IDEMPOTENCY_KEY="d-1")
    assert first.status_code == 200, first.content
    assert "arrived damaged" in first.json()["payload"]["reason"]
    record = IdempotencyRecord.objects.get(key="d-1")
    stored = bytes(record.response_sealed)
    for secret in (b"arrived damaged", b"rita@example.com", b"A-1"):
        assert secret not in stored
    replay = client.post(path, body, format="json", HTTP_IDEMPOTENCY_KEY="d-1")
    assert replay.json() == first.json()
    assert replay["Idempotent-Replayed"] == "true"

    other = f"/api/v1/approvals/{waiting_request(tenant).pk}/decision"
    decided = client.post(other, body, format="json", HTTP_IDEMPOTENCY_KEY="d-2")
    assert decided.status_code == 200
    IdempotencyRecord.objects.filter(key="d-2").update(response_sealed=stored)
    moved = client.post(other, body, format="json", HTTP_IDEMPOTENCY_KEY="d-2")
    assert_error(moved, 409, "idempotency_key_reused")


def test_a_created_threads_response_is_gone_with_the_thread():
    """The answer to a thread's creation shows its metadata: sealed under the
    thread's key, a replay after the thread's deletion answers 404 rather
    than the metadata, and the thread is not created again."""
    tenant, client = tenant_with_client()
    body = {"thread_id": "case-7", "agent": "refund", "metadata": {"channel": "web"}}
    key = {"HTTP_IDEMPOTENCY_KEY": "t-1"}
    first = client.post("/api/v1/threads", body, format="json", **key)
    assert first.status_code == 201, first.content
    replay = client.post("/api/v1/threads", body, format="json", **key)
    assert replay.json() == first.json() and replay["Idempotent-Replayed"] == "true"
    assert IdempotencyRecord.objects.get(key="t-1").thread.thread_id == "case-7"
    assert client.delete("/api/v1/threads/case-7").status_code == 202
    gone = client.post("/api/v1/threads", body, format="json", **key)
    assert_error(gone, 404, "not_found")
    assert "web" not in gone.content.decode()
    assert client.get("/api/v1/threads/case-7").status_code == 404


@probe_urls
def test_a_key_recorded_before_keys_were_per_caller_is_refused_not_run_again():
    tenant, client = tenant_with_client()
    IdempotencyRecord.objects.create(
        tenant=tenant, owner="", key="k-1", method="POST", path="/api/v1/probe",
        request_digest="0" * 64, response_status=201, response_sealed=None,
    )  # fmt: skip
    response = client.post(
        "/api/v1/probe",
        {"name": "x", "input": {}},
        format="json",
        HTTP_IDEMPOTENCY_KEY="k-1",
    )
    assert_error(response, 409, "idempotency_key_reused")


@probe_urls
def test_failed_request_does_not_burn_the_idempotency_key():
    _, client = tenant_with_client()
    bad = client.post(
        "/api/v1/probe", {"name": "x"}, format="json", HTTP_IDEMPOTENCY_KEY="k-1"
    )
    assert bad.status_code == 400
    good = client.post(
        "/api/v1/probe",
        {"name": "x", "input": {}},
        format="json",
        HTTP_IDEMPOTENCY_KEY="k-1",
    )
    assert good.status_code == 201


@probe_urls
def test_idempotency_keys_are_per_tenant():
    """Tenant B reusing tenant A's key value gets its own response, not A's."""
    _, client_a = tenant_with_client()
    _, client_b = tenant_with_client()
    body = {"name": "x", "input": {}}
    a = client_a.post(
        "/api/v1/probe", body, format="json", HTTP_IDEMPOTENCY_KEY="shared"
    )
    b = client_b.post(
        "/api/v1/probe", body, format="json", HTTP_IDEMPOTENCY_KEY="shared"
    )
    assert a.status_code == b.status_code == 201
    assert a.json()["tenant"] != b.json()["tenant"]
    assert "Idempotent-Replayed" not in b


def test_throttled_key_gets_429_and_other_keys_do_not(settings):
    settings.REST_FRAMEWORK = {
        **settings.REST_FRAMEWORK,
        "DEFAULT_THROTTLE_RATES": {"principal": "3/minute"},
    }
    _, client = tenant_with_client()
    statuses = [client.get("/api/v1/agents").status_code for _ in range(4)]
    assert statuses == [200, 200, 200, 429]
    response = client.get("/api/v1/agents")
    assert_error(response, 429, "throttled")
    assert int(response["Retry-After"]) > 0
    _, other = tenant_with_client()
    assert other.get("/api/v1/agents").status_code == 200


def test_session_user_acts_within_membership():
    membership = make_member(make_tenant(), role="tenant_admin")
    client = api_client()
    client.force_login(membership.user)
    assert client.get("/api/v1/agents").status_code == 200


def test_session_user_without_membership_is_403():
    outsider = make_member(make_tenant(), role="reviewer").user
    outsider.memberships.all().delete()
    client = api_client()
    client.force_login(outsider)
    assert_error(client.get("/api/v1/agents"), 403, "permission_denied")


def test_auditor_role_cannot_write():
    membership = make_member(make_tenant(), role="auditor")
    from runs.access import Principal

    principal = Principal.for_membership(membership)
    assert principal.can("audit", write=False)
    assert not principal.can("approvals", write=True)


def test_tenant_admin_cannot_decide_approvals_over_the_api():
    membership = make_member(make_tenant(), role="tenant_admin")
    client = api_client()
    client.force_login(membership.user)
    assert_error(client.get("/api/v1/approvals"), 403, "permission_denied")


def test_every_unsafe_api_endpoint_honours_idempotency_keys_or_says_why_not():
    from django.urls import URLPattern, get_resolver

    from runs.api.idempotency import UNSAFE_METHODS

    def views(patterns, prefix=""):
        for pattern in patterns:
            route = prefix + str(pattern.pattern)
            if isinstance(pattern, URLPattern):
                if hasattr(pattern.callback, "cls") and route.startswith("api/"):
                    yield route, pattern.callback.cls
            else:
                yield from views(pattern.url_patterns, route)

    unsafe = {
        (route, name): cls
        for route, cls in views(get_resolver().url_patterns)
        for name in UNSAFE_METHODS
        if hasattr(cls, name)
    }
    assert ("api/v1/approvals/<uuid:approval_id>/decision", "post") in unsafe
    neither = [
        f"{name.upper()} {route}"
        for (route, name), cls in unsafe.items()
        if not getattr(getattr(cls, name), "idempotent", False)
        and not getattr(cls, "idempotency_exempt", "")
    ]
    assert neither == []


@override_settings(GATEHOUSE_AUTH_FAILURE_RATE="5/minute")
def test_failed_authentication_is_throttled_per_client_address():
    """Issue 16, finding 7: failed API authentication was never throttled."""
    tenant = make_tenant()
    _, secret = make_api_key(tenant)
    guesser = api_client("gh_XXXXXXXXX.wrong")
    for _ in range(5):
        response = guesser.get("/api/v1/agents", REMOTE_ADDR="203.0.113.7")
        assert_error(response, 401, "authentication_failed")
    throttled = guesser.get("/api/v1/agents", REMOTE_ADDR="203.0.113.7")
    assert_error(throttled, 429, "throttled")
    assert int(throttled["Retry-After"]) > 0
    # Even a right key from that address waits; other addresses do not.
    right = api_client(secret)
    assert right.get("/api/v1/agents", REMOTE_ADDR="203.0.113.7").status_code == 429
    assert right.get("/api/v1/agents", REMOTE_ADDR="198.51.100.2").status_code == 200


@override_settings(GATEHOUSE_AUTH_FAILURE_RATE="3/minute")
def test_a_client_cannot_pick_its_own_address_with_x_forwarded_for():
    """DRF took the whole X-Forwarded-For as the address unless NUM_PROXIES is
    set: a guesser sending a new one per request was never throttled. The
    address is REMOTE_ADDR (set by uvicorn from the trusted proxies' header)."""
    make_tenant()
    guesser = api_client("gh_XXXXXXXXX.wrong")
    statuses = [
        guesser.get(
            "/api/v1/agents", REMOTE_ADDR="203.0.113.8", HTTP_X_FORWARDED_FOR=f"10.0.0.{i}"
        ).status_code
        for i in range(5)
    ]
    assert statuses == [401, 401, 401, 429, 429]


def test_a_body_serializer_checks_the_next_body_with_nothing_of_the_last():
    """body_validated keeps a serializer for the next body: a refused body
    leaves no error, a checked one no value, and each body's defaults are its
    own (a default that is a mutable value is refused, as it would be shared)."""
    from rest_framework import serializers
    from rest_framework.exceptions import ValidationError

    from runs.api.serializers import _IDLE, ThreadCreateSerializer, body_validated

    first = body_validated(ThreadCreateSerializer, {"agent": "refund"})
    first["metadata"]["mine"] = True
    with pytest.raises(ValidationError) as refused:
        body_validated(ThreadCreateSerializer, {"thread_id": "x" * 300})
    assert set(refused.value.detail) == {"thread_id", "agent"}
    second = body_validated(
        ThreadCreateSerializer, {"agent": "other", "thread_id": "t"}
    )
    assert second == {"agent": "other", "thread_id": "t", "metadata": {}}
    assert first == {"agent": "refund", "metadata": {"mine": True}}
    for kept in _IDLE[ThreadCreateSerializer]:
        assert not {"initial_data", "_validated_data", "_errors"} & set(vars(kept))

    class SharedDefault(serializers.Serializer):
        tags = serializers.ListField(child=serializers.CharField(), default=[])

    with pytest.raises(TypeError, match="SharedDefault.tags"):
        body_validated(SharedDefault, {})


def test_a_refused_body_error_holds_nothing_of_the_kept_serializer():
    """DRF's is_valid(raise_exception=True) raises its errors as a ReturnDict
    whose `.serializer` is the instance body_validated gives back for the next
    request: a renderer reading it (the browsable API's) could show that
    request's body. The error raised is a plain copy, with the same messages
    and codes."""
    from rest_framework.exceptions import ErrorDetail, ValidationError

    from runs.api.serializers import _IDLE, ThreadCreateSerializer, body_validated

    with pytest.raises(ValidationError) as refused:
        body_validated(ThreadCreateSerializer, {"thread_id": "x" * 300})
    detail = refused.value.detail
    assert type(detail) is dict
    assert not hasattr(detail, "serializer")
    kept = _IDLE[ThreadCreateSerializer]
    assert all(
        value is not serializer
        for serializer in kept
        for value in vars(refused.value).values()
    )
    assert detail["agent"] == [ErrorDetail("This field is required.", "required")]
    assert detail["agent"][0].code == "required"
    assert detail["thread_id"][0].code == "max_length"


@pytest.mark.parametrize(
    "accept",
    [
        None,
        "*/*",
        "application/json",
        "application/json; indent=4",
        "text/html",
        "text/html, */*;q=0.1",
        "application/*",
        "",
        "application/JSON",
        "*/*;q=0",
    ],
)
@pytest.mark.parametrize("query", ["", "format=json", "format=csv", "format="])
def test_the_api_negotiates_as_drf_does(accept, query):
    """runs.api.parsers.JSONContentNegotiation answers its common case at
    once: the same renderer and media type as DRF's own, or the same refusal."""
    from django.http import Http404
    from django.test import RequestFactory
    from rest_framework.exceptions import NotAcceptable
    from rest_framework.negotiation import DefaultContentNegotiation
    from rest_framework.renderers import BrowsableAPIRenderer
    from rest_framework.request import Request

    from runs.api.parsers import JSONContentNegotiation, SafeJSONRenderer

    headers = {} if accept is None else {"HTTP_ACCEPT": accept}
    for renderers in (
        [SafeJSONRenderer()],
        [SafeJSONRenderer(), BrowsableAPIRenderer()],
    ):
        answers = []
        for negotiation in (DefaultContentNegotiation(), JSONContentNegotiation()):
            request = Request(
                RequestFactory().get(f"/api/v1/agents?{query}", **headers)
            )
            try:
                renderer, media_type = negotiation.select_renderer(request, renderers)
                answers.append((type(renderer), media_type))
            except (NotAcceptable, Http404) as refusal:
                answers.append(type(refusal))
        assert answers[0] == answers[1], (accept, query, answers)


def test_the_api_answers_json_whatever_the_accept_header_asks_for_it_by():
    _, api = tenant_with_client()
    for accept in (None, "*/*", "application/json"):
        headers = {} if accept is None else {"HTTP_ACCEPT": accept}
        response = api.get("/api/v1/agents", **headers)
        assert response.status_code == 200
        assert response["Content-Type"] == "application/json"
    assert_error(
        api.get("/api/v1/agents", HTTP_ACCEPT="text/html"), 406, "not_acceptable"
    )
