"""The browser's middleware (session, request.user, messages)
runs for the admin and for a session's API calls, and is stepped over by an
API request that a key authenticates or refuses (runs.api.middleware.keyed)."""

from __future__ import annotations

import pytest
from django.contrib.auth.middleware import AuthenticationMiddleware
from django.contrib.messages.middleware import MessageMiddleware
from django.contrib.sessions.middleware import SessionMiddleware
from rest_framework.test import APIClient

from tests.factories import (
    api_client,
    make_api_key,
    make_member,
    make_superuser,
    make_tenant,
)

pytestmark = pytest.mark.django_db

BROWSER = (SessionMiddleware, AuthenticationMiddleware, MessageMiddleware)


@pytest.fixture
def entered(monkeypatch):
    """The browser middleware whose process_request ran, by class name."""
    names: list[str] = []
    for cls in BROWSER:
        original = cls.process_request

        def noted(self, request, _original=original, _name=cls.__name__):
            names.append(_name)
            return _original(self, request)

        monkeypatch.setattr(cls, "process_request", noted)
    return names


def test_a_keyed_api_request_steps_over_the_browser_middleware(entered):
    _, secret = make_api_key(make_tenant())
    response = api_client(secret).get("/api/v1/agents")
    assert response.status_code == 200
    assert entered == []
    assert "Set-Cookie" not in response
    # The headers every answer carries are still there.
    assert response["X-Frame-Options"] == "DENY"
    assert response["X-Content-Type-Options"] == "nosniff"
    assert "Content-Security-Policy" in response


def test_an_agent_protocol_request_with_x_api_key_steps_over_them(entered):
    _, secret = make_api_key(make_tenant())
    client = APIClient()
    client.credentials(HTTP_X_API_KEY=secret)
    assert client.post("/langgraph/threads", {}, format="json").status_code == 200
    assert entered == []


def test_a_wrong_key_is_refused_by_the_key_not_let_in_by_a_session(entered):
    """A logged-in browser sending a wrong Bearer key: 401, the session is
    not consulted (as before: the key's authentication raises first)."""
    client = api_client("gh_nothing.wrong")
    client.force_login(make_member(make_tenant(), role="tenant_admin").user)
    response = client.get("/api/v1/agents")
    assert response.status_code == 401
    assert entered == []


def test_a_session_api_request_goes_through_them(entered):
    membership = make_member(make_tenant(), role="tenant_admin")
    client = api_client()
    client.force_login(membership.user)
    assert client.get("/api/v1/agents").status_code == 200
    assert entered == [c.__name__ for c in BROWSER]


def test_a_session_api_write_still_needs_its_csrf_token():
    membership = make_member(make_tenant(), role="tenant_admin")
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(membership.user)
    response = client.post("/api/v1/threads", {"agent": "refund"}, format="json")
    assert response.status_code == 403
    assert "CSRF" in response.json()["message"]


@pytest.mark.parametrize("junk", ["Bearer junk", "Bearer gh_x.y", "Bearer "])
def test_a_session_write_with_a_junk_key_is_refused_not_let_in_by_the_session(junk):
    """A logged-in browser that also sends a key header, without a CSRF
    token: the key decides (401), the session never stands in for it."""
    membership = make_member(make_tenant(), role="tenant_admin")
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(membership.user)
    response = client.post(
        "/api/v1/threads", {"agent": "refund"}, format="json", HTTP_AUTHORIZATION=junk
    )
    assert response.status_code == 401, response.content


def test_a_bearer_header_outside_the_apis_changes_nothing(entered, client):
    """The admin with an Authorization header: session, CSRF and the rest."""
    make_superuser(username="root", password="pw-for-tests-only")
    response = client.get("/admin/login/", HTTP_AUTHORIZATION="Bearer gh_x.y")
    assert response.status_code == 200
    assert "csrftoken" in response.cookies
    assert entered == [c.__name__ for c in BROWSER]
