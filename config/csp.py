"""django-csp's middleware, with the site's policy built once per process.

django-csp builds the Content-Security-Policy header from the settings for
every response, and its report-only twin too: it copies the policy and joins
its directives, some 50 µs of CPU per request, the most of any middleware in
the chain. The policy is a setting, the same for every response that changes
nothing of it: such a response gets the headers built the first time. One
that does (a csp_update/csp_replace/csp_exempt decorator, a nonce drawn by a
template, a header set by the view) goes through django-csp as is, and so
does every response with DEBUG on or URL prefixes excluded, which django-csp
decides per request.
"""

from __future__ import annotations

import functools

from csp import middleware
from csp.constants import HEADER, HEADER_REPORT_ONLY
from csp.utils import build_policy
from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

_SETTINGS = ("CONTENT_SECURITY_POLICY", "CONTENT_SECURITY_POLICY_REPORT_ONLY")
# What a view or decorator sets on a response to change its policy.
_PER_RESPONSE = tuple(
    f"_csp_{part}{suffix}"
    for part in ("config", "update", "replace", "exempt")
    for suffix in ("", "_ro")
)


@functools.cache
def _site_headers() -> tuple[tuple[str, str], ...] | None:
    """The headers of a response that changes nothing of the policy; None
    where django-csp decides per request."""
    if settings.DEBUG or any(
        (getattr(settings, name, None) or {}).get("EXCLUDE_URL_PREFIXES")
        for name in _SETTINGS
    ):
        return None
    headers = (
        (HEADER, build_policy()),
        (HEADER_REPORT_ONLY, build_policy(report_only=True)),
    )
    return tuple((name, value) for name, value in headers if value)


@receiver(setting_changed)
def _policy_changed(*, setting, **kwargs) -> None:
    if setting in (*_SETTINGS, "DEBUG"):
        _site_headers.cache_clear()


class CSPMiddleware(middleware.CSPMiddleware):
    def process_response(self, request, response):
        headers = _site_headers()
        if (
            headers is None
            or getattr(request, "_csp_nonce", None) is not None
            or any(hasattr(response, name) for name in _PER_RESPONSE)
            or HEADER in response
            or HEADER_REPORT_ONLY in response
        ):
            return super().process_response(request, response)
        for name, value in headers:
            response[name] = value
        # As django-csp: a nonce asked for once the header is out is an error.
        request.csp_nonce = middleware.CheckableLazyObject(
            self._csp_nonce_post_response
        )
        return response
