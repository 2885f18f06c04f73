"""The key rings and every use of them: the one place Gatehouse does crypto.

Pure: it reads no model and writes no row. The rows that hold keys and
ciphertext are handled by `runs.storage` (shredding, deletion, rotation).

Envelope encryption. Each thread has its own random 256-bit data key, stored in
`Thread.wrapped_data_key` wrapped (AES-256-GCM) by the active master key of
`GATEHOUSE_MASTER_KEYS`, whose id is kept in `Thread.data_key_id`. Everything a
user, a model or a tool produced is encrypted with the thread's data key
(AES-256-GCM, a random 96-bit nonce per ciphertext). docs/checkpoints.md has
the byte formats; in short::

    ciphertext  = 0x01 | nonce (12) | AES-256-GCM(data key, plaintext, aad)
    aad         = msgpack(["gatehouse", 1, tenant pk, thread pk, kind, *row])
    wrapped key = 0x02 | nonce (12) | AES-256-GCM(master key, data key, wrap aad)
    wrap aad    = msgpack(["gatehouse-data-key", 2, master key id, tenant pk,
                           "thread", thread pk])

The associated data names the tenant, the thread and the row a ciphertext
belongs to, so a ciphertext copied to another row, thread or tenant fails to
decrypt; a wrapped key copied to another thread (or tenant) does not unwrap. A stored value that does not start with the format byte is refused,
never read as plaintext.

The API for everything that stores thread content (checkpoints here; run
inputs, resume values, tool results and approval payloads elsewhere)::

    cipher = ThreadCipher.for_thread(thread)        # ThreadDeleted if shredded
    blob = cipher.encrypt_value(value, row=("run-input", run.id))
    value = cipher.decrypt_value(blob, row=("run-input", run.id))
    cipher.encrypt(raw_bytes, row=...) / cipher.decrypt(blob, row=...)

`row` identifies the stored value: a kind first (`"run-input"`,
`"tool-result"`, ...; `"checkpoint"`, `"metadata"`, `"blob"` and `"write"` are
the checkpoint store's), then ids, all `str` or `int`. Use ids known before the
row is saved (not an auto-increment pk), and the same tuple to decrypt. Values
go through `runs.serde.StrictSerializer` (no pickle, allow-listed types) and
are compressed (zstd) first when large.

A `ThreadCipher` holds the key as read with its thread: build one per unit of
work from a freshly read `Thread`.
Unwrapped keys are cached per process, keyed by the wrapped bytes, so building
one is cheap.

The audit key ring, `GATEHOUSE_AUDIT_KEYS`, has the same format and rules
(ids, the first one active) and a single use: `audit_mac()`, the HMAC-SHA256
that seals the audit trail's blocks and signs its heads (audit.sealing). It
lives outside the database, so someone who can write the audit tables cannot
forge a seal.

`new_data_key()` makes a key for one row (`Thread.objects.create_with_data_key`
calls it with the thread's `thread_key_owner()`; webhook subscriptions wrap
their signing secrets the same way), `rewrap_data_key()` moves one to the
active master key
(`runs.storage.data_keys_rotate`), `forget_data_key()` drops a destroyed one
from this process's cache (`runs.storage.threads_shred`). A thread whose
wrapped key is gone (shredded) raises `ThreadDeleted` on any use.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import secrets
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache, lru_cache
from typing import TYPE_CHECKING, Any

import ormsgpack
import zstandard
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from runs.serde import StrictSerializer, default_serializer

if TYPE_CHECKING:
    from runs.models import Thread


MASTER_KEY_BYTES = 32
MASTER_KEYS_SETTING = "GATEHOUSE_MASTER_KEYS"
AUDIT_KEYS_SETTING = "GATEHOUSE_AUDIT_KEYS"


@dataclass(frozen=True)
class KeyRing:
    """Keys by id, as configured in `setting`; the first one is the active key.

    Two rings share this shape: the master keys (the active one wraps new data
    keys) and the audit keys (the active one seals new audit blocks).
    """

    active_id: str
    keys: dict[str, bytes]
    setting: str = MASTER_KEYS_SETTING
    # Unwrapped data keys; it lives and dies with the ring, so a changed ring
    # (a key removed) is never hidden by a cached key.
    data_keys: dict[tuple, AESGCM] = field(
        default_factory=dict, compare=False, repr=False
    )

    def key(self, key_id: str) -> bytes:
        try:
            return self.keys[key_id]
        except KeyError:
            raise KeyError(
                f"key {key_id!r} is not in {self.setting}; {_RETIREMENT[self.setting]}"
            ) from None


# When a key may leave each ring.
_RETIREMENT = {
    MASTER_KEYS_SETTING: "a key may leave the ring only after rotate_master_key "
    "has run",
    AUDIT_KEYS_SETTING: "an audit key must stay in the ring as long as blocks it "
    "sealed are kept",
}


def parse_keyring(spec: str, *, setting: str = MASTER_KEYS_SETTING) -> KeyRing:
    """Parse "id:base64key,id2:base64key2" (first is active) into a KeyRing."""
    keys: dict[str, bytes] = {}
    for position, entry in enumerate(part.strip() for part in spec.split(",")):
        if not entry:
            continue
        key_id, sep, encoded = entry.partition(":")
        if not sep or not key_id:
            raise ImproperlyConfigured(
                f"{setting} entry {position + 1} is not 'id:base64key'"
            )
        try:
            key = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise ImproperlyConfigured(
                f"{setting} key {key_id!r} is not valid base64"
            ) from None
        if len(key) != MASTER_KEY_BYTES:
            raise ImproperlyConfigured(
                f"{setting} key {key_id!r} must be {MASTER_KEY_BYTES} bytes "
                f"(256 bits), not {len(key)}"
            )
        if key_id in keys:
            raise ImproperlyConfigured(f"{setting} names {key_id!r} twice")
        keys[key_id] = key
    if not keys:
        raise ImproperlyConfigured(f"{setting} holds no key")
    return KeyRing(active_id=next(iter(keys)), keys=keys, setting=setting)


@lru_cache(maxsize=1)
def keyring() -> KeyRing:
    # Production refuses to start without a ring (config/settings.py); the
    # embedded mode fills it from the key it generated under var/.
    return parse_keyring(settings.GATEHOUSE_MASTER_KEYS)


@lru_cache(maxsize=1)
def audit_keyring() -> KeyRing:
    """The keys that seal the audit trail (audit.sealing); never in the database."""
    return parse_keyring(settings.GATEHOUSE_AUDIT_KEYS, setting=AUDIT_KEYS_SETTING)


def audit_mac(payload: bytes, *, key_id: str) -> str:
    """HMAC-SHA256 of `payload` under the audit key `key_id`, in hex.

    KeyError when the ring no longer holds that key.
    """
    key = audit_keyring().key(key_id)
    return hmac.new(key, payload, hashlib.sha256).hexdigest()


# What someone who reads a generated development key can do.
_DEVELOPMENT_KEY_RISKS = {
    MASTER_KEYS_SETTING: "Anyone who can read that file can read every thread.",
    AUDIT_KEYS_SETTING: "Anyone who can read that file and write the database "
    "can re-seal the audit trail.",
}


def development_key_warnings() -> list[str]:
    """One line per ring that is a development key the embedded mode generated
    under var/: printed when `make run` starts, listed by /readyz and shown on
    the admin's front page (not by every command)."""
    return [
        f"{setting} is not set: the embedded mode uses the development key in "
        f"{path}. {_DEVELOPMENT_KEY_RISKS[setting]} Set {setting} before storing "
        "real data."
        for setting, path in settings.GATEHOUSE_DEVELOPMENT_KEY_FILES.items()
    ]


# --- Errors ----------------------------------------------------------------------


class CryptoError(Exception):
    """Thread content could not be encrypted or decrypted."""


class ThreadDeleted(CryptoError):
    """The thread's data key was destroyed: its content is gone for good."""


class NotCiphertext(CryptoError):
    """A stored value is not Gatehouse ciphertext; plaintext is never read."""


class TamperedCiphertext(CryptoError):
    """A ciphertext failed authentication: altered, or from another row."""


# --- Formats ---------------------------------------------------------------------

FORMAT_V1 = 0x01
# Wrapped data keys whose associated data names the row they belong to.
WRAP_FORMAT = 0x02
NONCE_BYTES = 12
TAG_BYTES = 16
DATA_KEY_BYTES = 32
_AAD_PREFIX = "gatehouse"
_WRAP_AAD_PREFIX = "gatehouse-data-key"
# Values larger than this are compressed before encryption: ciphertext does
# not compress, so the database's own compression no longer helps.
COMPRESS_MIN_BYTES = 256
# Flags in the encoding byte, above the serde type code: zstd alone (values
# over DICTIONARY_MAX_BYTES, and all values written before the dictionary), or
# zstd with FORMAT_DICTIONARY. Both set: refused.
_ZSTD = 0x40
_ZSTD_DICT = 0x80
_CODEC_BITS = _ZSTD_DICT | _ZSTD
_ZSTD_LEVEL = 1
# Values of a few KB at most (a checkpoint, a step's writes: two a step) take
# a level that finds more in them for a few microseconds more: a chat step's
# checkpoint 165 -> 152 bytes compressed, its message 298 -> 295, each
# 10-20 us of CPU (32 KB would take 400 us at this level against 80 us).
_ZSTD_SMALL_LEVEL = 5
SMALL_MAX_BYTES = 1 << 12
# Values written rarely and kept long (a DeltaChannel's snapshot: the whole
# message list, once per cadence) compress harder: chat messages 15% smaller
# than at level 1 at 125 KB (25 ms of CPU on the benchmark machine), 29% at
# 250 KB (38 ms). Larger ones take the usual level, so that a long thread's
# snapshot does not hold its step up. zstd reads every level alike.
_ZSTD_COMPACT_LEVEL = 15
COMPACT_MAX_BYTES = 1 << 18
# Values larger than this compress without FORMAT_DICTIONARY (flag 0x40): a
# few hundred bytes of structure are nothing to them, and zstd with a
# dictionary matches less well at the compact level (chat messages: 64 KB
# 7% and 128 KB 15% smaller without it at level 15; at level 1 within 1%).
DICTIONARY_MAX_BYTES = 1 << 15
# Frames are stored without zstd's magic number (since 2026-12-06), which
# says nothing a value's encoding byte does not. Frames written before keep
# it, and read as before: a magicless frame never starts with the magic's
# first byte, 0x28, since it starts with the frame header descriptor, whose
# bit 3 is reserved and always 0 (RFC 8878, 3.1.1.1.1).
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_MAGICLESS = zstandard.FORMAT_ZSTD1_MAGICLESS
_codecs = threading.local()
# zstd's raw-content dictionary for the values Gatehouse stores: LangGraph's
# checkpoint and metadata keys, its special channels, the zero-padded channel
# versions, langchain-core messages as the serializer writes them. Structure,
# no content. Small values (a checkpoint, a step's message) then compress to
# about half what zstd makes of them alone. Stored values need these exact
# bytes to be read: never change them (tests pin their hash); a new
# dictionary is a new codec flag.
FORMAT_DICTIONARY = base64.b64decode(
    "A5PHhgWUvWxhbmdjaGFpbl9jb3JlLm1lc3NhZ2VzLmh1bWFurEh1bWFuTWVzc2FnZYanY29udGVu"
    "dKCxYWRkaXRpb25hbF9rd2FyZ3OAsXJlc3BvbnNlX21ldGFkYXRhgKR0eXBlpWh1bWFupG5hbWXA"
    "omlkoWGzbW9kZWxfdmFsaWRhdGVfanNvbsfPBZS6bGFuZ2NoYWluX2NvcmUubWVzc2FnZXMuYWmp"
    "QUlNZXNzYWdliadjb250ZW50oLFhZGRpdGlvbmFsX2t3YXJnc4CxcmVzcG9uc2VfbWV0YWRhdGGA"
    "pHR5cGWiYWmkbmFtZcCiaWShYqp0b29sX2NhbGxzkYSkbmFtZaF0pGFyZ3OAomlkoWOkdHlwZal0"
    "b29sX2NhbGyyaW52YWxpZF90b29sX2NhbGxzkK51c2FnZV9tZXRhZGF0YcCzbW9kZWxfdmFsaWRh"
    "dGVfanNvbserBZS8bGFuZ2NoYWluX2NvcmUubWVzc2FnZXMudG9vbKtUb29sTWVzc2FnZYmnY29u"
    "dGVudKCxYWRkaXRpb25hbF9rd2FyZ3OAsXJlc3BvbnNlX21ldGFkYXRhgKR0eXBlpHRvb2ykbmFt"
    "ZcCiaWShZKx0b29sX2NhbGxfaWShY6hhcnRpZmFjdMCmc3RhdHVzp3N1Y2Nlc3OzbW9kZWxfdmFs"
    "aWRhdGVfanNvbgOYkwCobWVzc2FnZXPEAJMBqmJyYW5jaDp0bzrEAJP9rV9faW50ZXJydXB0X1/E"
    "AJP8ql9fcmVzdW1lX1/EAJP/qV9fZXJyb3JfX8QAk/6tX19zY2hlZHVsZWRfX8QAkwCqX19yZXR1"
    "cm5fX8QAkwCuX19wcmVnZWxfdGFza3PEAAOJpnNvdXJjZaRsb29wpHN0ZXABp3BhcmVudHOApnJ1"
    "bl9pZKCpdGhyZWFkX2lkoKxhc3Npc3RhbnRfaWSgqGdyYXBoX2lkoL1jb3VudGVyc19zaW5jZV9k"
    "ZWx0YV9zbmFwc2hvdIGobWVzc2FnZXOSAQK2ZGVsdGFfd3JpdGVzX3ZlcnNpb25lZIGobWVzc2Fn"
    "ZXMBA4Omc291cmNlpWlucHV0pHN0ZXD/p3BhcmVudHOAA4Gmc291cmNlpnVwZGF0ZQOBpnNvdXJj"
    "ZaRmb3JrA4ihdgSidHPZIDIwMjYtMDEtMDFUMDA6MDA6MDAuMDAwMDAwKzAwOjAwsGNoYW5uZWxf"
    "dmVyc2lvbnODqV9fc3RhcnRfX9kkMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDEuMC41"
    "qG1lc3NhZ2Vz2SQwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMi4wLjWqYnJhbmNoOnRv"
    "OtkkMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDIuMC41rXZlcnNpb25zX3NlZW6DqV9f"
    "aW5wdXRfX4CpX19zdGFydF9fgalfX3N0YXJ0X1/ZJDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAw"
    "MDAwMDAxLjAuNaCBqmJyYW5jaDp0bzrZJDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAx"
    "LjAuNbB1cGRhdGVkX2NoYW5uZWxzkqpicmFuY2g6dG86qG1lc3NhZ2VzrmNoYW5uZWxfdmFsdWVz"
    "gqpicmFuY2g6dG86wK1fX3ByZWdlbF9wdWxswK1ibG9iX2NoYW5uZWxzkK1wZW5kaW5nX3NlbmRz"
    "kA=="
)
_DATA_KEY_CACHE_SIZE = 10_000
_cache_lock = threading.Lock()


def _seal(
    aead: AESGCM, plaintext: bytes, aad: bytes, *, version: int = FORMAT_V1
) -> bytes:
    nonce = os.urandom(NONCE_BYTES)
    return bytes((version,)) + nonce + aead.encrypt(nonce, plaintext, aad)


def _open(
    aead: AESGCM,
    blob: bytes | memoryview,
    aad: bytes,
    what: str,
    *,
    version: int = FORMAT_V1,
) -> bytes:
    blob = bytes(blob)
    if len(blob) < 1 + NONCE_BYTES + TAG_BYTES or blob[0] != version:
        lead = f"0x{blob[0]:02x}" if blob else "nothing"
        raise NotCiphertext(
            f"{what} is not Gatehouse ciphertext (format byte {lead}, "
            f"{len(blob)} bytes); refusing to read it as plaintext"
        )
    nonce = blob[1 : 1 + NONCE_BYTES]
    try:
        return aead.decrypt(nonce, blob[1 + NONCE_BYTES :], aad)
    except InvalidTag:
        raise TamperedCiphertext(
            f"{what} failed authentication: it was altered, or it belongs to "
            "another row, thread or tenant"
        ) from None


def _pack(parts: Sequence[Any]) -> bytes:
    for part in parts:
        kind = type(part)  # str and int themselves first: every value's AAD
        if kind is not str and kind is not int and (
            not isinstance(part, (str, int)) or isinstance(part, bool)
        ):
            raise TypeError(
                f"associated data parts must be str or int, not {type(part).__name__}"
            )
    return ormsgpack.packb(list(parts))


# --- Data keys -------------------------------------------------------------------


@dataclass(frozen=True)
class WrappedDataKey:
    """A data key as stored: encrypted under the master key `key_id`."""

    wrapped: bytes
    key_id: str


# What a wrapped key belongs to: its kind and the row's primary key, e.g.
# ("thread", 42) or ("webhook-subscription", "0f3c..."). With the tenant, it is
# the wrap's associated data, so a wrapped key copied to another row (of the
# same tenant or not) does not unwrap.
KeyOwner = tuple[str, int | str]


def _wrap_aad(key_id: str, tenant_id: int, owner: KeyOwner) -> bytes:
    kind, pk = owner
    return _pack([_WRAP_AAD_PREFIX, WRAP_FORMAT, key_id, tenant_id, kind, pk])


def _legacy_wrap_aad(key_id: str, tenant_id: int) -> bytes:
    # Before the wrap named its row: bound to the master key and tenant only.
    return _pack([_WRAP_AAD_PREFIX, FORMAT_V1, key_id, tenant_id])


def _wrap(
    data_key: bytes, *, tenant_id: int, owner: KeyOwner, ring: KeyRing
) -> WrappedDataKey:
    key_id = ring.active_id
    wrapped = _seal(
        AESGCM(ring.key(key_id)),
        data_key,
        _wrap_aad(key_id, tenant_id, owner),
        version=WRAP_FORMAT,
    )
    return WrappedDataKey(wrapped=wrapped, key_id=key_id)


def new_data_key(*, tenant_id: int, owner: KeyOwner) -> WrappedDataKey:
    """A fresh random data key for the row `owner`, wrapped by the active
    master key."""
    return _wrap(
        secrets.token_bytes(DATA_KEY_BYTES),
        tenant_id=tenant_id,
        owner=owner,
        ring=keyring(),
    )


def is_legacy_wrap(wrapped: bytes | memoryview) -> bool:
    """A key wrapped before wraps named their row (runs migration 0015
    rewraps them)."""
    return bytes(wrapped[:1]) == bytes((FORMAT_V1,))


def unwrap_data_key(
    *, wrapped: bytes, key_id: str, tenant_id: int, owner: KeyOwner
) -> bytes:
    """The data key of the row `owner`; TamperedCiphertext if the wrapped key
    belongs to another row or tenant, or was altered."""
    master = AESGCM(keyring().key(key_id))
    what = f"data key of {owner[0]} {owner[1]} wrapped by {key_id!r}"
    if is_legacy_wrap(wrapped):
        raise TamperedCiphertext(
            f"{what} is in the format before keys were bound to their row; "
            "`manage.py migrate` rewraps such keys"
        )
    return _open(
        master,
        wrapped,
        _wrap_aad(key_id, tenant_id, owner),
        what,
        version=WRAP_FORMAT,
    )


def rewrap_data_key(
    *, wrapped: bytes, key_id: str, tenant_id: int, owner: KeyOwner
) -> WrappedDataKey | None:
    """The data key wrapped by the active master key, bound to `owner`; None if
    it already is.

    A key in the format before wraps named their row is read under the
    associated data it was written with and bound to `owner`: the upgrade
    (runs migration 0015), and the rotation of a key whose master key was
    missing from the ring when the upgrade ran.
    """
    ring = keyring()
    if is_legacy_wrap(wrapped):
        data_key = _open(
            AESGCM(ring.key(key_id)),
            wrapped,
            _legacy_wrap_aad(key_id, tenant_id),
            f"data key of {owner[0]} {owner[1]} wrapped by {key_id!r}",
        )
    elif key_id == ring.active_id:
        return None
    else:
        data_key = unwrap_data_key(
            wrapped=wrapped, key_id=key_id, tenant_id=tenant_id, owner=owner
        )
    return _wrap(data_key, tenant_id=tenant_id, owner=owner, ring=ring)


def _data_key_aead(
    *, tenant_id: int, thread_pk: int, wrapped: bytes, key_id: str
) -> AESGCM:
    ring = keyring()
    cache_key = (thread_pk, tenant_id, key_id, wrapped)
    aead = ring.data_keys.get(cache_key)
    if aead is None:
        aead = AESGCM(
            unwrap_data_key(
                wrapped=wrapped,
                key_id=key_id,
                tenant_id=tenant_id,
                owner=thread_key_owner(thread_pk),
            )
        )
        with _cache_lock:
            if len(ring.data_keys) >= _DATA_KEY_CACHE_SIZE:
                # Oldest first: dicts keep insertion order.
                ring.data_keys.pop(next(iter(ring.data_keys)))
            ring.data_keys[cache_key] = aead
    return aead


THREAD_KEY_OWNER = "thread"


def thread_key_owner(thread_pk: int) -> KeyOwner:
    """What a thread's wrapped data key is bound to, besides its tenant."""
    return (THREAD_KEY_OWNER, thread_pk)


def forget_data_key(thread_pk: int) -> None:
    """Drop a thread's unwrapped key from this process's cache."""
    ring = keyring()
    with _cache_lock:
        for cache_key in [k for k in ring.data_keys if k[0] == thread_pk]:
            ring.data_keys.pop(cache_key, None)


# --- Values that belong to no thread ------------------------------------------------

SEALED_FORMAT = 0x03
_SEALED_AAD_PREFIX = "gatehouse-sealed"


def _sealing_aead(ring: KeyRing, key_id: str, purpose: str) -> AESGCM:
    # One key per master key and purpose, derived (HKDF-SHA256), so a value
    # sealed for one purpose never opens as another's; cached with the ring.
    cache_key = (_SEALED_AAD_PREFIX, key_id, purpose)
    aead = ring.data_keys.get(cache_key)
    if aead is None:
        derived = HKDF(
            algorithm=hashes.SHA256(),
            length=DATA_KEY_BYTES,
            salt=None,
            info=f"{_SEALED_AAD_PREFIX}:{purpose}".encode(),
        ).derive(ring.key(key_id))
        aead = AESGCM(derived)
        with _cache_lock:
            ring.data_keys[cache_key] = aead
    return aead


def _sealed_aad(purpose: str, key_id: str, context: Sequence[str | int]) -> bytes:
    return _pack([_SEALED_AAD_PREFIX, SEALED_FORMAT, purpose, key_id, *context])


def seal(plaintext: bytes, *, purpose: str, context: Sequence[str | int]) -> bytes:
    """Encrypt a value that belongs to no thread (a stored API response) under
    a key derived from the active master key, bound to `purpose` and
    `context` (the ids of the row that holds it)::

        sealed = 0x03 | len(key id) | key id | nonce (12) | AES-256-GCM(...)

    Retiring the master key (rotate_master_key, then removing it) makes every
    copy unreadable, backups included, as for thread content.
    """
    ring = keyring()
    key_id = ring.active_id
    aead = _sealing_aead(ring, key_id, purpose)
    encoded = key_id.encode()
    body = _seal(aead, plaintext, _sealed_aad(purpose, key_id, context))
    return bytes((SEALED_FORMAT, len(encoded))) + encoded + body


def unseal(
    blob: bytes | memoryview, *, purpose: str, context: Sequence[str | int]
) -> bytes:
    """The plaintext `seal` sealed; CryptoError if it is not such a value, was
    altered or moved, or its master key left the ring."""
    blob = bytes(blob)
    if len(blob) < 2 or blob[0] != SEALED_FORMAT:
        raise NotCiphertext(f"a {purpose} value is not a sealed value")
    end = 2 + blob[1]
    key_id = blob[2:end].decode(errors="replace")
    ring = keyring()
    if key_id not in ring.keys:
        raise CryptoError(
            f"a {purpose} value was sealed by master key {key_id!r}, "
            "which is no longer in the ring"
        )
    aead = _sealing_aead(ring, key_id, purpose)
    return _open(
        aead, blob[end:], _sealed_aad(purpose, key_id, context), f"a {purpose} value"
    )


# --- Thread content ----------------------------------------------------------------


class ThreadCipher:
    """Encrypts and decrypts one thread's content, bound to its rows."""

    __slots__ = ("tenant_id", "thread_pk", "_aead")

    def __init__(self, *, tenant_id: int, thread_pk: int, aead: AESGCM) -> None:
        self.tenant_id = tenant_id
        self.thread_pk = thread_pk
        self._aead = aead

    @classmethod
    def from_wrapped(
        cls,
        *,
        tenant_id: int,
        thread_pk: int,
        wrapped: bytes | memoryview | None,
        key_id: str,
        label: str = "",
    ) -> ThreadCipher:
        if wrapped is None:
            raise ThreadDeleted(
                f"thread {label or thread_pk} was deleted: its data key was "
                "destroyed, so its content can no longer be read or written"
            )
        aead = _data_key_aead(
            tenant_id=tenant_id,
            thread_pk=thread_pk,
            wrapped=bytes(wrapped),
            key_id=key_id,
        )
        return cls(tenant_id=tenant_id, thread_pk=thread_pk, aead=aead)

    @classmethod
    def for_thread(cls, thread: Thread) -> ThreadCipher:
        if thread.pk is None:
            raise ValueError("a thread must be saved before its content is encrypted")
        return cls.from_wrapped(
            tenant_id=thread.tenant_id,
            thread_pk=thread.pk,
            wrapped=thread.wrapped_data_key,
            key_id=thread.data_key_id,
            label=repr(thread.thread_id),
        )

    def _aad(self, row: Sequence[str | int]) -> bytes:
        if not row:
            raise ValueError("row must name the stored value, kind first")
        return _pack([_AAD_PREFIX, FORMAT_V1, self.tenant_id, self.thread_pk, *row])

    def encrypt(self, plaintext: bytes, *, row: Sequence[str | int]) -> bytes:
        return _seal(self._aead, plaintext, self._aad(row))

    def decrypt(
        self, ciphertext: bytes | memoryview, *, row: Sequence[str | int]
    ) -> bytes:
        what = f"{row[0]} {'/'.join(map(str, row[1:]))} of thread {self.thread_pk}"
        return _open(self._aead, ciphertext, self._aad(row), what)

    def encrypt_value(
        self,
        value: Any,
        *,
        row: Sequence[str | int],
        serializer: StrictSerializer | None = None,
        compact: bool = False,
    ) -> bytes:
        return self.encrypt(encode_value(value, serializer, compact=compact), row=row)

    def decrypt_value(
        self,
        ciphertext: bytes | memoryview,
        *,
        row: Sequence[str | int],
        serializer: StrictSerializer | None = None,
    ) -> Any:
        return decode_value(self.decrypt(ciphertext, row=row), serializer)


@cache
def _format_dictionary() -> zstandard.ZstdCompressionDict:
    return zstandard.ZstdCompressionDict(
        FORMAT_DICTIONARY, dict_type=zstandard.DICT_TYPE_RAWCONTENT
    )


def _compressor(level: int, codec: int) -> zstandard.ZstdCompressor:
    # zstd contexts are not safe to share between threads; one per thread.
    compressors = getattr(_codecs, "compressors", None)
    if compressors is None:
        compressors = _codecs.compressors = {}
    compressor = compressors.get((level, codec))
    if compressor is None:
        dictionary = _format_dictionary() if codec == _ZSTD_DICT else None
        compressor = compressors[(level, codec)] = zstandard.ZstdCompressor(
            level=level, dict_data=dictionary
        )
    return compressor


def _decompressor(codec: int, *, magic: bool) -> zstandard.ZstdDecompressor:
    decompressors = getattr(_codecs, "decompressors", None)
    if decompressors is None:
        decompressors = _codecs.decompressors = {
            (codec, magic): zstandard.ZstdDecompressor(
                dict_data=_format_dictionary() if codec == _ZSTD_DICT else None,
                format=zstandard.FORMAT_ZSTD1 if magic else _MAGICLESS,
            )
            for codec in (_ZSTD, _ZSTD_DICT)
            for magic in (True, False)
        }
    return decompressors[(codec, magic)]


def writes_earlier_format() -> bool:
    """Whether values are written as the releases of 1-5 December 2026 read
    them (zstd frames with their magic number, a checkpoint's `ts` as text):
    during a rolling upgrade from them (settings.GATEHOUSE_WRITE_FORMAT)."""
    return settings.GATEHOUSE_WRITE_FORMAT == "2026-12-01"


def encode_value(
    value: Any, serializer: StrictSerializer | None = None, *, compact: bool = False
) -> bytes:
    """The plaintext of a value: the encoding byte (serde type code, and a flag
    for its codec), then the bytes. `compact`: a value written rarely and
    kept long, compressed harder (up to COMPACT_MAX_BYTES)."""
    encoded = (serializer or default_serializer()).dumps(value)
    if len(encoded) <= COMPRESS_MIN_BYTES:
        return encoded
    if compact and len(encoded) <= COMPACT_MAX_BYTES:
        level = _ZSTD_COMPACT_LEVEL
    elif len(encoded) <= SMALL_MAX_BYTES:
        level = _ZSTD_SMALL_LEVEL
    else:
        level = _ZSTD_LEVEL
    codec = _ZSTD_DICT if len(encoded) <= DICTIONARY_MAX_BYTES else _ZSTD
    frame = _compressor(level, codec).compress(memoryview(encoded)[1:])
    # Stored without zstd's magic number: 4 bytes a value (two a chat step).
    packed = memoryview(frame)[0 if writes_earlier_format() else len(_ZSTD_MAGIC) :]
    if len(packed) + 1 >= len(encoded):
        return encoded
    return bytes((encoded[0] | codec,)) + packed


def decode_value(plaintext: bytes, serializer: StrictSerializer | None = None) -> Any:
    codec = plaintext[0] & _CODEC_BITS if plaintext else 0
    if codec:
        if codec == _CODEC_BITS:
            raise CryptoError(f"unknown encoding byte 0x{plaintext[0]:02x}")
        frame = memoryview(plaintext)[1:]
        magic = frame[: len(_ZSTD_MAGIC)] == _ZSTD_MAGIC
        body = _decompressor(codec, magic=magic).decompress(frame)
        plaintext = bytes((plaintext[0] & ~_CODEC_BITS,)) + body
    return (serializer or default_serializer()).loads(plaintext)


# --- Handing a secret over once ---------------------------------------------------

HANDOFF_AAD = b"gatehouse-handoff-1"


def handoff_seal(secret: str) -> tuple[str, str]:
    """Encrypt `secret` under a fresh one-time key, to carry it across a
    redirect: returns (key, sealed), both URL-safe text. Keep them apart (the
    key in the next URL, the sealed text server side): neither alone reveals
    the secret, and once the sealed text is dropped the key opens nothing."""
    key = AESGCM.generate_key(bit_length=256)
    sealed = _seal(AESGCM(key), secret.encode(), HANDOFF_AAD)
    return _b64(key), _b64(sealed)


def handoff_open(key: str, sealed: str) -> str | None:
    """The secret `handoff_seal` sealed, or None when the two do not belong
    together (a wrong, altered or truncated key or text)."""
    try:
        aead = AESGCM(base64.urlsafe_b64decode(key.encode()))
        blob = base64.urlsafe_b64decode(sealed.encode())
        return _open(aead, blob, HANDOFF_AAD, "handoff").decode()
    except (ValueError, binascii.Error, CryptoError, UnicodeDecodeError):
        return None


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode()
