"""Refuses an oversized API body before anything reads it."""

from django.conf import settings

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
