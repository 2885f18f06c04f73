"""The Idempotency-Key header: a retried write returns its first response.

The first request with a key reserves it (a row with no response yet), runs,
and stores its successful response, all in one transaction. A repeat with the
same key and the same method, path and body gets that response again; with
anything else, 409. A repeat that arrives while the first is still running
waits on the key's unique index: it replays the first's response once that
commits, or does the work itself if the first rolled back, and so the work is
never done twice. Because the reservation commits only with the work, a
request that fails half-way for any reason (an error, its database connection
lost in an outage, its process killed) leaves no reservation behind: the
client's retry with the same key does the work. Error responses are not
stored: the client may fix the cause and retry with the same key. Records are
kept for GATEHOUSE_IDEMPOTENCY_TTL.

Keys are each caller's own: an API key (or a signed-in user) never sees the
record, let alone the response, of another key of the same tenant that used
the same Idempotency-Key. The request's digest is an HMAC under a key derived
from SECRET_KEY, not a bare hash: a body's content (a subject's e-mail in a
deletion request) cannot be recovered by hashing candidates. The stored
response is sealed under a key derived from the master key ring
(runs.crypto.seal), bound to its record: a decision's answer shows the
request's payload, which must not sit in clear in the database.

It is on by default: the API's views mix in `IdempotentWrites`, which wraps
every unsafe method a view defines; a view whose writes must not be replayed
says why in `idempotency_exempt` (tests/runs/test_api_plumbing.py checks
that every unsafe endpoint is one or the other).
"""

from __future__ import annotations

import functools
import json

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.crypto import salted_hmac
from rest_framework import exceptions
from rest_framework.response import Response
from rest_framework.utils.encoders import JSONEncoder

from runs import crypto
from runs.crypto import CryptoError
from runs.errors import StateConflict
from runs.models import IdempotencyRecord

HEADER = "Idempotency-Key"
MAX_KEY_LENGTH = 255
UNSAFE_METHODS = ("post", "put", "patch", "delete")


_DIGEST_SALT = "gatehouse.idempotency.request"
# Records written before keys were each caller's own; they expire within the
# TTL. A key found among them is refused rather than run a second time.
_UNOWNED = ""


def _request_digest(request) -> str:
    canonical = json.dumps(
        request.data, sort_keys=True, separators=(",", ":"), default=str
    )
    material = f"{request.method}\n{request.path}\n{canonical}"
    return salted_hmac(_DIGEST_SALT, material, algorithm="sha256").hexdigest()


_SEALED_PURPOSE = "idempotent-response"


def _record_context(record: IdempotencyRecord) -> tuple:
    # The response opens only in the record it was stored in.
    return (record.tenant_id, record.owner, record.key)


def _unseal(record: IdempotencyRecord):
    if record.response_sealed is None:
        raise CryptoError("no sealed response")
    plaintext = crypto.unseal(
        record.response_sealed, purpose=_SEALED_PURPOSE, context=_record_context(record)
    )
    return json.loads(plaintext)


def _owner(principal) -> str:
    """Whose namespace of Idempotency-Keys a request is in."""
    if principal.api_key is not None:
        return f"api_key:{principal.api_key.pk}"
    return f"user:{principal.membership.user_id}"


def _reserve(
    *, tenant, owner: str, key: str, request, digest: str
) -> IdempotencyRecord | None:
    """Reserve the key; None when it was already reserved (a repeat)."""
    records = IdempotencyRecord.objects.for_tenant(tenant).filter(key=key)
    expired_before = timezone.now() - settings.GATEHOUSE_IDEMPOTENCY_TTL
    records.filter(created_at__lt=expired_before).delete()
    if records.filter(owner=_UNOWNED).exists():
        raise StateConflict(
            "That Idempotency-Key was used before an upgrade; use a new key.",
            code="idempotency_key_reused",
        )
    try:
        with transaction.atomic():
            return IdempotencyRecord.objects.create(
                tenant=tenant,
                owner=owner,
                key=key,
                method=request.method,
                path=request.path[:2000],
                request_digest=digest,
            )
    except IntegrityError:
        return None


def _replay(*, tenant, owner: str, key: str, digest: str) -> Response:
    previous = (
        IdempotencyRecord.objects.for_tenant(tenant)
        .filter(owner=owner, key=key)
        .first()
    )
    if previous is None:  # the first request rolled back meanwhile: retryable
        raise StateConflict(
            "That Idempotency-Key is in use; retry.", code="idempotency_in_progress"
        )
    if previous.request_digest != digest:
        raise StateConflict(
            "That Idempotency-Key was used with another request; use a new key.",
            code="idempotency_key_reused",
        )
    if previous.response_status is None:
        raise StateConflict(
            "The first request with that Idempotency-Key is still being handled.",
            code="idempotency_in_progress",
        )
    try:
        body = _unseal(previous)
    except CryptoError:
        # Stored before responses were sealed, or under a retired master key:
        # it cannot be replayed, and the work must not be done twice.
        raise StateConflict(
            "The first response to that Idempotency-Key can no longer be replayed; "
            "use a new key.",
            code="idempotency_key_reused",
        ) from None
    response = Response(body, status=previous.response_status)
    response["Idempotent-Replayed"] = "true"
    return response


def _store(record: IdempotencyRecord, response: Response) -> None:
    """Keep a successful response for repeats; release the key otherwise."""
    if not 200 <= response.status_code < 300:
        record.delete()
        return
    record.response_status = response.status_code
    # As the client received it: UUIDs, datetimes and decimals as strings.
    record.response_sealed = crypto.seal(
        json.dumps(response.data, cls=JSONEncoder).encode(),
        purpose=_SEALED_PURPOSE,
        context=_record_context(record),
    )
    record.save(update_fields=["response_status", "response_sealed"])


def idempotent(view_method):
    """Decorate an APIView's unsafe method: honour the Idempotency-Key header."""

    @functools.wraps(view_method)
    def wrapper(view, request, *args, **kwargs):
        key = request.headers.get(HEADER)
        if key is None:
            return view_method(view, request, *args, **kwargs)
        if not key or len(key) > MAX_KEY_LENGTH or not key.isprintable():
            raise exceptions.ValidationError(
                {HEADER: [f"must be 1 to {MAX_KEY_LENGTH} printable characters"]}
            )
        tenant, owner = request.principal.tenant, _owner(request.principal)
        digest = _request_digest(request)
        # The reservation, the work and the stored response commit together or
        # not at all (see the module's docstring); tasks the work sends on
        # commit leave after all three.
        with transaction.atomic():
            record = _reserve(
                tenant=tenant, owner=owner, key=key, request=request, digest=digest
            )
            if record is not None:
                response = view_method(view, request, *args, **kwargs)
                _store(record, response)
                return response
        return _replay(tenant=tenant, owner=owner, key=key, digest=digest)

    wrapper.idempotent = True
    return wrapper


class IdempotentWrites:
    """Mixed into API views (before DRF's classes): every post, put, patch and
    delete that a subclass defines is `idempotent`."""

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        for name in UNSAFE_METHODS:
            handler = cls.__dict__.get(name)
            if handler is not None and not getattr(handler, "idempotent", False):
                setattr(cls, name, idempotent(handler))
