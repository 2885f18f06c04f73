"""The API's one error body: {"code", "message", "fields"?}, for every error."""

from __future__ import annotations

import logging
import sys

from django.core.exceptions import PermissionDenied, RequestDataTooBig
from django.db import DataError
from django.http import Http404, HttpResponse, JsonResponse
from django.utils.deprecation import MiddlewareMixin
from django.views import defaults
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import set_rollback

from runs import outages
from runs.crypto import CryptoError, ThreadDeleted
from runs.errors import ApiError, StateConflict

logger = logging.getLogger(__name__)

# Paths whose every answer, errors included, is JSON: /api/v1 and the Agent
# Protocol (agent_protocol, mounted by config.urls).
JSON_API_PREFIXES = ("/api/", "/langgraph/")


class PayloadTooLarge(ApiError):
    def __init__(self, message: str) -> None:
        super().__init__(
            message,
            code="payload_too_large",
            status_code=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
        )


_DEFAULT_CODES = {
    exceptions.ParseError: "parse_error",
    exceptions.AuthenticationFailed: "authentication_failed",
    exceptions.NotAuthenticated: "not_authenticated",
    exceptions.PermissionDenied: "permission_denied",
    exceptions.NotFound: "not_found",
    exceptions.MethodNotAllowed: "method_not_allowed",
    exceptions.NotAcceptable: "not_acceptable",
    exceptions.UnsupportedMediaType: "unsupported_media_type",
    exceptions.Throttled: "throttled",
    exceptions.ValidationError: "invalid",
}


class ServiceUnavailable(ApiError):
    """The database or the broker is unavailable: the client retries later."""

    def __init__(self) -> None:
        super().__init__(
            "A service Gatehouse depends on is unavailable; retry shortly.",
            code="service_unavailable",
            status_code=status.HTTP_503_SERVICE_UNAVAILABLE,
        )
        self.wait = outages.RETRY_AFTER_SECONDS


def error_body(code: str, message: str, fields: dict | None = None) -> dict:
    body = {"code": code, "message": message}
    if fields is not None:
        body["fields"] = fields
    return body


def _flatten(detail) -> object:
    if isinstance(detail, dict):
        return {key: _flatten(value) for key, value in detail.items()}
    if isinstance(detail, list):
        return [_flatten(item) for item in detail]
    return str(detail)


def _unreadable(exc: CryptoError) -> exceptions.APIException:
    """Stored content that cannot be decrypted: a thread deleted while the
    request read it is gone (404); anything else failed authentication
    (altered, or copied from another row or thread) and is refused for this
    request only, never a 500 that would hide which content it was."""
    if isinstance(exc, ThreadDeleted):
        return exceptions.NotFound("The thread was deleted.")
    logger.error("stored content unreadable: %s", exc)
    return StateConflict(
        "This content cannot be read: what is stored failed authentication "
        "(altered, or copied from another thread). The rest of the thread's "
        "records are unaffected; the server log names the value.",
        code="content_unreadable",
    )


def _holds_nul(exc: Exception) -> bool:
    """A value of the request with a NUL character in it (a thread id in a
    path, say), which no Postgres text can hold: psycopg refuses to send it.
    Nothing stored can match such a value, so it is the client's error."""
    return isinstance(exc, DataError) and "NUL (0x00)" in str(exc.__cause__ or exc)


def exception_handler(exc, context) -> Response | None:
    if isinstance(exc, CryptoError):
        exc = _unreadable(exc)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied()
    elif isinstance(exc, RequestDataTooBig):
        exc = PayloadTooLarge("The request body is larger than this API accepts.")
    elif _holds_nul(exc):
        exc = exceptions.ValidationError(
            "A value in the request contains a NUL character, which no id or "
            "text here can hold."
        )
    elif outages.is_outage(exc):
        _log_outage(context["request"], exc)
        exc = ServiceUnavailable()
    if not isinstance(exc, exceptions.APIException):
        return None  # a server fault: Django's 500 handling logs it

    headers = {}
    if getattr(exc, "auth_header", None):
        headers["WWW-Authenticate"] = exc.auth_header
    if getattr(exc, "wait", None):
        headers["Retry-After"] = str(int(exc.wait))

    code = next(
        (code for kind, code in _DEFAULT_CODES.items() if isinstance(exc, kind)), None
    )
    if isinstance(exc, exceptions.ValidationError):
        detail = exc.detail
        if isinstance(detail, dict):
            body = error_body(code, "The request has invalid fields.", _flatten(detail))
        else:
            messages = _flatten(detail)
            message = (
                " ".join(messages) if isinstance(messages, list) else str(messages)
            )
            body = error_body(code, message, {})
    else:
        detail = exc.detail
        if code is None:
            codes = exc.get_codes()
            code = codes if isinstance(codes, str) else exc.default_code
        body = error_body(code, str(detail))
        if isinstance(exc, ApiError) and exc.extra:
            body.update(exc.extra)

    set_rollback()
    return Response(body, status=exc.status_code, headers=headers)


def json_error(request, code: str, message: str, status_code: int) -> JsonResponse:
    return JsonResponse(error_body(code, message), status=status_code)


@csrf_exempt  # nothing to protect: a POST to an unknown route is a JSON 404
def api_not_found(request, *args, **kwargs) -> JsonResponse:
    return json_error(request, "not_found", "No such endpoint.", 404)


def _log_outage(request, error: BaseException) -> None:
    # One line, not a traceback: the outage is the operator's news, not a bug.
    logger.warning(
        "%s %s: answered 503, a service is unavailable (%s)",
        request.method,
        request.path,
        type(error.__cause__ or error).__name__,
    )


def outage_response(request, error: BaseException) -> HttpResponse:
    """503 with Retry-After: the API's error body, or a short page."""
    _log_outage(request, error)
    if request.path.startswith(JSON_API_PREFIXES):
        exc = ServiceUnavailable()
        response = json_error(request, exc.get_codes(), str(exc.detail), 503)
    else:
        response = HttpResponse(
            "Gatehouse is briefly unavailable; try again in a few seconds.\n",
            status=503,
            content_type="text/plain; charset=utf-8",
        )
    response["Retry-After"] = str(outages.RETRY_AFTER_SECONDS)
    return response


class OutageMiddleware(MiddlewareMixin):
    """Answers 503 instead of 500 when a view (the admin, /langgraph/, any
    view outside DRF) fails because the database or the broker is down, or
    refuses a change of access it could not announce to the web processes
    (`runs.api.key_cache.AccessChangeUnannounced`: a misconfigured cache)."""

    def process_exception(self, request, exception):
        from runs.api.key_cache import AccessChangeUnannounced

        if outages.is_outage(exception):
            return outage_response(request, exception)
        if isinstance(exception, AccessChangeUnannounced):
            logger.error("%s %s: %s", request.method, request.path, exception)
            return HttpResponse(
                f"{exception.detail}\n",
                status=503,
                content_type="text/plain; charset=utf-8",
            )
        return None


def bad_request(request, exception=None, *args, **kwargs):
    """Django's 400 handler (a request it refuses before any view: a Host
    header that is empty or not allowed, a cookie or header it cannot
    parse): JSON under the APIs, as every other refusal there, the usual
    page elsewhere."""
    if request.path.startswith(JSON_API_PREFIXES):
        return json_error(request, "bad_request", "The request is malformed.", 400)
    return defaults.bad_request(request, exception)


def server_error(request, *args, **kwargs):
    """Django's 500 handler: JSON under the APIs, the usual page elsewhere;
    503 when the fault is an outage raised outside a view (a middleware
    reading the session, say)."""
    error = sys.exc_info()[1]
    if error is not None and outages.is_outage(error):
        return outage_response(request, error)
    if request.path.startswith(JSON_API_PREFIXES):
        return json_error(
            request, "server_error", "Something went wrong on the server.", 500
        )
    return defaults.server_error(request)
