"""JSON in and out of the API, with what no view can cope with stopped at the
boundary.

In: `StrictJSONParser` reads the body as UTF-8, the one encoding of JSON
(RFC 8259 §8.1): a Content-Type naming another charset is refused with a 415
before anything is decoded (Python would otherwise decode with any codec it
has by that name, `bz2` and `zlib_codec` among them: a few hundred bytes
inflating to hundreds of megabytes behind the body size limit). Then it
refuses, with a 400 that names where in the body:

- nesting deeper than MAX_DEPTH: Python's recursion limit would turn a
  1,000-deep document into a 500, and nothing Gatehouse stores is that deep;
- numbers that are not finite (`NaN`, `Infinity`, or `1e400`, which reads as
  infinity): JSON has no such numbers, and a stored one would break every
  later rendering of the thread;
- integers outside 64 bits: MessagePack (the checkpoint store's format) and
  Postgres stop there;
- a lone surrogate (`"\\ud800"`) in a string or a key: JSON's `\\u` escapes
  can spell one and json.loads reads it, but it is no character: UTF-8,
  Postgres and every renderer refuse it (a DataError, a TypeError, an
  unrenderable 400 had each answered 500).

Out: `SafeJSONRenderer` renders a value that JSON cannot hold (a non-finite
number an agent produced itself) as `{"unreadable": "..."}`, and a text UTF-8
cannot hold (a lone surrogate) \\u-escaped, instead of failing the whole
response, so one odd value never makes a page answer 500 for
everyone.
"""

from __future__ import annotations

import copy
import json
import math
import re
from typing import Any

from django.utils.http import parse_header_parameters
from rest_framework import exceptions
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.parsers import JSONParser
from rest_framework.renderers import JSONRenderer
from rest_framework.settings import api_settings

MAX_DEPTH = 32
INT_MIN, INT_MAX = -(2**63), 2**63 - 1
UNREADABLE_NUMBER = {"unreadable": "not a finite number"}
# The charsets a JSON body may declare (any case): UTF-8's name, and the
# spelling without the hyphen that clients send too.
UTF_8_NAMES = frozenset({"utf-8", "utf8"})


def declared_charset(media_type: str | None) -> str | None:
    """The charset a Content-Type names, or None when it names none."""
    _, params = parse_header_parameters(media_type or "")
    return params.get("charset")


def check_charset(media_type: str | None) -> None:
    """A 415 for a body declared in a charset other than UTF-8."""
    charset = declared_charset(media_type)
    if charset is not None and charset.strip().lower() not in UTF_8_NAMES:
        shown = charset if len(charset) <= 40 else charset[:40] + "..."
        raise exceptions.UnsupportedMediaType(
            media_type,
            detail=(
                f'The body\'s charset "{shown}" is not accepted: a JSON body is '
                "UTF-8 (RFC 8259); send no charset or charset=utf-8."
            ),
        )


# A lone surrogate in decoded text (a pair, "\\ud83d\\ude00", decodes to one
# character); in the body's text, the escape that can make one (also a false
# alarm for an escaped backslash before "ud8..", sorted out by the walk).
_SURROGATE = re.compile("[\ud800-\udfff]")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _join(path: str, key: Any) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]" if path else f"[{key}]"
    return f"{path}.{key}" if path else str(key)


def unsafe_value(data: Any) -> tuple[str, str] | None:
    """(where, what) of the first value in `data` the API refuses, or None."""
    stack = [(data, "", 0)]
    while stack:
        value, path, depth = stack.pop()
        if isinstance(value, dict | list):
            if depth >= MAX_DEPTH:
                return path or "body", f"is nested deeper than {MAX_DEPTH} levels"
            items = value.items() if isinstance(value, dict) else enumerate(value)
            stack.extend(
                (item, _join(path, key), depth + 1)
                for key, item in reversed(list(items))
            )
        elif isinstance(value, float) and not math.isfinite(value):
            return path or "body", "must be a finite number"
        elif (
            isinstance(value, int)
            and not isinstance(value, bool)
            and not INT_MIN <= value <= INT_MAX
        ):
            return path or "body", "must be an integer that fits in 64 bits"
    return None


def _shown(key: str) -> str:
    """A key as a field name the error body can render: its lone
    surrogates \\u-escaped."""
    return key.encode("utf-8", "backslashreplace").decode("utf-8")


def lone_surrogate(data: Any) -> str | None:
    """Where in `data` a string or key holding a lone surrogate is (one of
    them, if several), or None."""
    stack = [(data, "")]
    while stack:
        value, path = stack.pop()
        if isinstance(value, str):
            if _SURROGATE.search(value):
                return path or "body"
        elif isinstance(value, dict):
            for key, item in value.items():
                if _SURROGATE.search(key):
                    return _join(path, _shown(key))
                stack.append((item, _join(path, key)))
        elif isinstance(value, list):
            stack.extend((item, _join(path, i)) for i, item in enumerate(value))
    return None


class StrictJSONParser(JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        # Never the request's encoding (DRF's parser_context["encoding"]):
        # Django takes any codec Python has as the charset.
        check_charset(media_type)
        try:
            # UTF-8, strictly (an invalid byte is a 400); NaN and Infinity
            # read as floats here, to be named below.
            text = stream.read().decode("utf-8")
            data = json.loads(text, parse_constant=float)
        except RecursionError:
            raise exceptions.ParseError(
                f"The JSON body is nested deeper than {MAX_DEPTH} levels."
            ) from None
        except ValueError as exc:
            raise exceptions.ParseError(f"JSON parse error - {exc}") from None
        where = _SURROGATE_ESCAPE.search(text) and lone_surrogate(data)
        if where:
            raise exceptions.ValidationError(
                {
                    where: [
                        f"{where} holds a lone surrogate (an unpaired \\ud800-"
                        "\\udfff escape), which is no character."
                    ]
                }
            )
        problem = unsafe_value(data)
        if problem is not None:
            where, what = problem
            raise exceptions.ValidationError({where: [f"{where} {what}."]})
        return data


def _renderable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return UNREADABLE_NUMBER
    if isinstance(value, dict):
        return {key: _renderable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_renderable(item) for item in value]
    return value


class SafeJSONRenderer(JSONRenderer):
    def render(self, data, accepted_media_type=None, renderer_context=None):
        try:
            return super().render(data, accepted_media_type, renderer_context)
        except ValueError:
            # A non-finite number (rendered as unreadable), or a lone
            # surrogate UTF-8 cannot encode (rendered \\u-escaped, as
            # ensure_ascii writes every character past ASCII): the rest as is.
            fallback = copy.copy(self)
            fallback.ensure_ascii = True
            return JSONRenderer.render(
                fallback, _renderable(data), accepted_media_type, renderer_context
            )


class JSONContentNegotiation(DefaultContentNegotiation):
    """DRF's negotiation, answered at once for what nearly every request
    asks of a view with one renderer: no Accept header, `*/*`, or that
    renderer's own media type, and no format override. DRF parses the
    Accept header into media types and ranks them per request (~60 µs of
    CPU, the most of DRF's per-request set-up); its answer there is the
    same pair: the renderer and its media type. Anything else (several
    renderers, another Accept, `?format=`) goes through DRF's own."""

    def select_renderer(self, request, renderers, format_suffix=None):
        if len(renderers) == 1 and not format_suffix:
            renderer = renderers[0]
            accept = request._request.META.get("HTTP_ACCEPT", "*/*")
            if (
                accept == "*/*" or accept == renderer.media_type
            ) and api_settings.URL_FORMAT_OVERRIDE not in request.query_params:
                return renderer, renderer.media_type
        return super().select_renderer(request, renderers, format_suffix)
