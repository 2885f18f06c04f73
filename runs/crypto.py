"""The master key ring and every use of it: the one place Gatehouse does crypto."""

from __future__ import annotations

import base64
import binascii
import logging
import os
import secrets
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

logger = logging.getLogger(__name__)

MASTER_KEY_BYTES = 32


@dataclass(frozen=True)
class KeyRing:
    """Master keys by id; the first one wraps new data keys."""

    active_id: str
    keys: dict[str, bytes]

    def key(self, key_id: str) -> bytes:
        try:
            return self.keys[key_id]
        except KeyError:
            raise KeyError(
                f"master key {key_id!r} is not in GATEHOUSE_MASTER_KEYS; "
                "a key may leave the ring only after rotate_master_key has run"
            ) from None


def parse_keyring(spec: str) -> KeyRing:
    """Parse "id:base64key,id2:base64key2" (first is active) into a KeyRing."""
    keys: dict[str, bytes] = {}
    for position, entry in enumerate(part.strip() for part in spec.split(",")):
        if not entry:
            continue
        key_id, sep, encoded = entry.partition(":")
        if not sep or not key_id:
            raise ImproperlyConfigured(
                f"GATEHOUSE_MASTER_KEYS entry {position + 1} is not 'id:base64key'"
            )
        try:
            key = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise ImproperlyConfigured(
                f"GATEHOUSE_MASTER_KEYS key {key_id!r} is not valid base64"
            ) from None
        if len(key) != MASTER_KEY_BYTES:
            raise ImproperlyConfigured(
                f"GATEHOUSE_MASTER_KEYS key {key_id!r} must be {MASTER_KEY_BYTES} bytes "
                f"(AES-256), not {len(key)}"
            )
        if key_id in keys:
            raise ImproperlyConfigured(f"GATEHOUSE_MASTER_KEYS names {key_id!r} twice")
        keys[key_id] = key
    if not keys:
        raise ImproperlyConfigured("GATEHOUSE_MASTER_KEYS holds no key")
    return KeyRing(active_id=next(iter(keys)), keys=keys)


def generate_master_key_entry(key_id: str) -> str:
    """A new ring entry, "id:base64key", for operators and the embedded mode."""
    return f"{key_id}:{base64.b64encode(secrets.token_bytes(MASTER_KEY_BYTES)).decode()}"


def _embedded_keyring_spec(path: Path) -> str:
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        # O_EXCL: web, worker and beat start together; exactly one creates the key.
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass
        else:
            with os.fdopen(fd, "w") as handle:
                handle.write(generate_master_key_entry("embedded-1") + "\n")
    logger.warning(
        "\n%s\nGATEHOUSE_MASTER_KEYS is not set: using the development key in %s.\n"
        "Anyone who can read that file can read every checkpoint. Set "
        "GATEHOUSE_MASTER_KEYS before storing real data.\n%s",
        "!" * 78,
        path,
        "!" * 78,
    )
    return path.read_text().strip()


@lru_cache(maxsize=1)
def keyring() -> KeyRing:
    spec = settings.GATEHOUSE_MASTER_KEYS
    if not spec:
        if not settings.DEBUG:
            raise ImproperlyConfigured(
                "GATEHOUSE_MASTER_KEYS is not set and DEBUG is off: refusing to start "
                "without a master key. Generate one with "
                "`python -c \"import base64,os;print('k1:'+base64.b64encode("
                "os.urandom(32)).decode())\"` and set GATEHOUSE_MASTER_KEYS=<that>."
            )
        spec = _embedded_keyring_spec(Path(settings.GATEHOUSE_MASTER_KEY_FILE))
    return parse_keyring(spec)
