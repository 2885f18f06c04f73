"""Keeping personal data out of the audit trail (see the rule in audit/events.py).

`describe()` turns arguments into something an auditor can compare but not
read: each value becomes a keyed digest, except the keys an agent declares safe
to show. `clean_data()` is what `record()` runs on every event's data.

The digests are HMAC-SHA256 under a key derived from SECRET_KEY (or
GATEHOUSE_AUDIT_DIGEST_KEY when set), not bare SHA-256: a bare digest of an
e-mail address or a phone number is reversed by hashing a list of candidates.
Equal values still give equal digests, so "the refund executed had the
arguments that were approved" can be checked from the trail alone.
"""

from __future__ import annotations

import datetime
import decimal
import json
import math
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from django.conf import settings
from django.utils.crypto import salted_hmac

DIGEST_PREFIX = "hmac-sha256:"
DIGEST_HEX_CHARS = 16
# The longest string an event's data may hold, in clear: enough for ids,
# labels and short statuses, too short for messages and documents.
MAX_TEXT = 200
MAX_LIST = 100
MAX_KEY = 64


class Described(dict):
    """Arguments as the audit trail may keep them: digests, or declared-safe
    values. The only nested mapping record() accepts."""


def digest(value: Any) -> str:
    """A short keyed digest of any JSON-able value, stable across processes."""
    canonical = json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str
    )
    secret = settings.GATEHOUSE_AUDIT_DIGEST_KEY or settings.SECRET_KEY
    mac = salted_hmac(
        "gatehouse.audit.digest\x00", canonical, secret=secret, algorithm="sha256"
    ).hexdigest()
    return DIGEST_PREFIX + mac[:DIGEST_HEX_CHARS]


def _plain(value: Any) -> Any:
    """Values that JSON cannot hold as they are, as the strings they print as:
    an amount stays "40.00" rather than becoming a float."""
    if isinstance(value, decimal.Decimal | uuid.UUID):
        return str(value)
    if isinstance(value, datetime.datetime | datetime.date):
        return value.isoformat()
    return value


def is_clear_scalar(value: Any) -> bool:
    """Whether a value may be kept in clear: a short string, a finite number,
    a boolean or null; never an object or a list, whatever key it sits under."""
    if isinstance(value, str):
        return len(value) <= MAX_TEXT
    if isinstance(value, float):
        return math.isfinite(value)  # JSON has no NaN or infinity
    return value is None or isinstance(value, bool | int)


def describe(
    args: Mapping[str, Any] | None, safe_keys: Iterable[str] = ()
) -> Described:
    """`{key: digest}` for every argument, except declared-safe scalar values.

    A safe key whose value is not a short scalar (a nested object, a long text)
    is digested anyway: declaring `order_id` safe must not let a whole customer
    record through because it happened to sit under that key.
    """
    safe = frozenset(safe_keys)
    described = Described()
    for key, value in (args or {}).items():
        name = str(key)[:MAX_KEY]
        value = _plain(value)
        if name in safe and is_clear_scalar(value):
            described[name] = value
        else:
            described[name] = digest(value)
    return described


def _check_value(key: str, value: Any) -> Any:
    value = _plain(value)
    if is_clear_scalar(value):
        return value
    if isinstance(value, str):
        raise ValueError(
            f"audit data {key!r} is a string of {len(value)} characters; at most "
            f"{MAX_TEXT} are kept in clear. Digest free text with "
            "audit.redaction.digest() or record the fact, not the text."
        )
    raise ValueError(
        f"audit data {key!r} holds a {type(value).__name__}; only short scalars, "
        "lists of them and audit.redaction.describe() results are allowed"
    )


def clean_data(data: Mapping[str, Any]) -> dict[str, Any]:
    """The event data as stored, or ValueError when it breaks events.py's rule.

    Decimals, UUIDs and dates become strings; anything that could carry
    personal data in bulk (a plain nested mapping, a long text) is refused.
    """
    cleaned: dict[str, Any] = {}
    for key, value in data.items():
        if not isinstance(key, str) or not key or len(key) > MAX_KEY:
            raise ValueError(f"audit data keys must be strings of 1 to {MAX_KEY} chars")
        if isinstance(value, Described):
            cleaned[key] = {
                str(inner_key): _check_value(f"{key}.{inner_key}", inner)
                for inner_key, inner in value.items()
            }
        elif isinstance(value, Mapping):
            raise ValueError(
                f"audit data {key!r} is a mapping; pass arguments through "
                "audit.redaction.describe(args, safe_keys) so that only digests "
                "and declared-safe fields are kept"
            )
        elif isinstance(value, list | tuple):
            if len(value) > MAX_LIST:
                raise ValueError(f"audit data {key!r} has more than {MAX_LIST} items")
            cleaned[key] = [_check_value(key, item) for item in value]
        else:
            cleaned[key] = _check_value(key, value)
    return cleaned
