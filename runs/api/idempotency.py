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
response is sealed, bound to its record: under the data key of the thread
whose content it shows, when the view says it shows some
(`shows_thread_content`: a decision's answer shows the request's payload and
the reviewer's note), so that deleting the thread shreds it with the rest of
the thread, backups included; otherwise under a key derived from the master
key ring (runs.crypto.seal). A replay of a response whose thread was deleted
answers 404, as the request itself would now; the row is cleared of its
response when the thread's rows are removed, and purged past the TTL by the
retention job `purge_idempotency_records`. A view whose replay shows content
whose reading is audited says so in `idempotent_replayed` (the decision's
records `approval.read`), called in the replay's transaction.

It is on by default: the API's views mix in `IdempotentWrites`, which wraps
every unsafe method a view defines; a view whose writes must not be replayed
says why in `idempotency_exempt` (tests/runs/test_api_plumbing.py checks
that every unsafe endpoint is one or the other).
"""

from __future__ import annotations

import functools
import json

from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.crypto import salted_hmac
from rest_framework import exceptions
from rest_framework.response import Response
from rest_framework.utils.encoders import JSONEncoder

from runs import crypto
from runs.crypto import CryptoError, ThreadCipher
from runs.errors import StateConflict
from runs.models import IdempotencyRecord, Thread

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


def _thread_row(record: IdempotencyRecord) -> tuple:
    # Under the thread's key: bound to the record as well.
    return (_SEALED_PURPOSE, record.pk, record.owner, record.key)


def _seal(record: IdempotencyRecord, plaintext: bytes, thread: Thread | None) -> bytes:
    if thread is not None:
        return ThreadCipher.for_thread(thread).encrypt(
            plaintext, row=_thread_row(record)
        )
    return crypto.seal(
        plaintext, purpose=_SEALED_PURPOSE, context=_record_context(record)
    )


def _unseal(record: IdempotencyRecord):
    if record.response_sealed is None:
        raise CryptoError("no sealed response")
    if record.thread_id is not None:
        plaintext = ThreadCipher.for_thread(record.thread).decrypt(
            record.response_sealed, row=_thread_row(record)
        )
    else:
        plaintext = crypto.unseal(
            record.response_sealed,
            purpose=_SEALED_PURPOSE,
            context=_record_context(record),
        )
    return json.loads(plaintext)


_SHOWN_THREAD = "_idempotency_shown_thread"


def shows_thread_content(request, thread: Thread) -> None:
    """Say that the response to `request` shows content of `thread`: if it is
    kept for a replay, it is sealed under the thread's data key, shredded
    with it, and a replay after the thread's deletion answers 404."""
    setattr(request, _SHOWN_THREAD, thread)


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
    records.filter(IdempotencyRecord.expired(timezone.now())).delete()
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
        .select_related("thread")
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
    if previous.thread_id is not None and (
        previous.thread.deleted_at is not None or previous.thread.is_shredded
    ):
        # What the response showed went with the thread; the request itself
        # would answer 404 now, and its work is not done again.
        raise exceptions.NotFound(
            "The thread of the first request with that Idempotency-Key was "
            "deleted; its response is gone with it."
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


def _store(
    record: IdempotencyRecord, response: Response, thread: Thread | None
) -> None:
    """Keep a successful response for repeats; release the key otherwise."""
    if not 200 <= response.status_code < 300:
        record.delete()
        return
    record.response_status = response.status_code
    record.thread = thread
    # As the client received it: UUIDs, datetimes and decimals as strings.
    record.response_sealed = _seal(
        record, json.dumps(response.data, cls=JSONEncoder).encode(), thread
    )
    record.save(update_fields=["response_status", "response_sealed", "thread"])


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
                _store(record, response, getattr(request, _SHOWN_THREAD, None))
                return response
        replayed = getattr(view, "idempotent_replayed", None)
        if replayed is None:
            return _replay(tenant=tenant, owner=owner, key=key, digest=digest)
        with transaction.atomic():
            response = _replay(tenant=tenant, owner=owner, key=key, digest=digest)
            # The read it shows again, audited in this transaction.
            replayed(request, *args, **kwargs)
        return response

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
