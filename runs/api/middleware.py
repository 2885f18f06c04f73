"""The API's own middleware: an oversized body refused before anything reads
it; and, for a request that authenticates with an API key, the browser's
middleware (session, `request.user`, messages) stepped over. CSRF's stays
Django's own for every request (`check --deploy` looks for it by name)."""

from django.conf import settings
from django.contrib.auth.middleware import AuthenticationMiddleware
from django.contrib.messages.middleware import MessageMiddleware
from django.contrib.sessions.middleware import SessionMiddleware

from runs.api.errors import JSON_API_PREFIXES, json_error


class ApiBodySizeLimitMiddleware:
    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request):
        if request.path.startswith(JSON_API_PREFIXES):
            raw = request.META.get("CONTENT_LENGTH") or "0"
            try:
                length = int(raw)
            except ValueError:
                return json_error(
                    request,
                    "bad_request",
                    "The Content-Length header is not a number.",
                    400,
                )
            limit = settings.GATEHOUSE_MAX_BODY_BYTES
            if length > limit:
                return json_error(
                    request,
                    "payload_too_large",
                    f"The request body is {length} bytes; the limit is {limit}.",
                    413,
                )
        return self.get_response(request)


def keyed(request) -> bool:
    """Whether the request is an API call that an API key authenticates, or
    refuses: under /api/ with `Authorization: Bearer ...`; under /langgraph/
    with that or a non-empty `x-api-key`. Such a request's caller is the key
    (runs.api.authentication, agent_protocol.access: the key's own 401 if it
    is not one, never the session's user), and no view under those prefixes
    reads a session or messages, so the browser's middleware has nothing to
    do for it."""
    try:
        return request._keyed
    except AttributeError:
        pass
    path = request.path
    meta = request.META
    bearer = meta.get("HTTP_AUTHORIZATION", "")[:7].lower() == "bearer "
    if path.startswith("/api/"):
        answer = bearer
    elif path.startswith("/langgraph/"):
        answer = bearer or bool(meta.get("HTTP_X_API_KEY", "").strip())
    else:
        answer = False
    request._keyed = answer
    return answer


class _BrowserOnly:
    """A middleware of the browser's (the admin's, a session's API calls),
    stepped over by a key-authenticated API request (`keyed`)."""

    def __call__(self, request):
        if keyed(request):
            return self.get_response(request)
        return super().__call__(request)


class BrowserSessionMiddleware(_BrowserOnly, SessionMiddleware):
    pass


class BrowserAuthenticationMiddleware(_BrowserOnly, AuthenticationMiddleware):
    """DRF sets `request.user` to the key's (ApiKeyUser) or, refused, to
    AnonymousUser."""


class BrowserMessageMiddleware(_BrowserOnly, MessageMiddleware):
    pass
