"""config.csp: the site's Content-Security-Policy, built once per process, is
the header django-csp writes; a response that changes its policy still gets
django-csp's own."""

from __future__ import annotations

import pytest
from csp.constants import HEADER, HEADER_REPORT_ONLY, SELF
from csp.middleware import CSPMiddleware as DjangoCSPMiddleware
from django.http import HttpResponse
from django.test import RequestFactory, override_settings

from config.csp import CSPMiddleware


def directives(header: str) -> set[str]:
    # django-csp's order of directives is a set's: compare them as a set.
    return {part.strip() for part in header.split(";")}


def answer(middleware_class, response=None, *, path="/api/v1/agents"):
    request = RequestFactory().get(path)
    middleware = middleware_class(lambda request: response or HttpResponse())
    return request, middleware(request)


def test_a_plain_response_gets_django_csps_header():
    _, ours = answer(CSPMiddleware)
    _, theirs = answer(DjangoCSPMiddleware)
    assert directives(ours[HEADER]) == directives(theirs[HEADER])
    assert "script-src 'self'" in ours[HEADER]
    assert HEADER_REPORT_ONLY not in ours


def test_a_nonce_asked_for_after_the_header_is_out_is_an_error():
    from csp.exceptions import CSPNonceError

    request, _ = answer(CSPMiddleware)
    with pytest.raises(CSPNonceError):
        str(request.csp_nonce)


def test_a_response_that_changes_its_policy_goes_through_django_csp():
    response = HttpResponse()
    response._csp_update = {"img-src": ["https://example.com"]}
    _, changed = answer(CSPMiddleware, response)
    assert "https://example.com" in changed[HEADER]
    exempt = HttpResponse()
    exempt._csp_exempt = True
    _, answered = answer(CSPMiddleware, exempt)
    assert HEADER not in answered


def test_a_changed_setting_is_the_next_responses_policy():
    with override_settings(
        CONTENT_SECURITY_POLICY={"DIRECTIVES": {"default-src": [SELF]}},
        CONTENT_SECURITY_POLICY_REPORT_ONLY={"DIRECTIVES": {"img-src": [SELF]}},
    ):
        _, response = answer(CSPMiddleware)
        _, theirs = answer(DjangoCSPMiddleware)
        assert response[HEADER] == "default-src 'self'"
        for name in (HEADER, HEADER_REPORT_ONLY):
            assert directives(response[name]) == directives(theirs[name])
    _, response = answer(CSPMiddleware)
    assert "script-src 'self'" in response[HEADER]
    assert HEADER_REPORT_ONLY not in response
