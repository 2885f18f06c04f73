"""Signed heads of the audit chain, and signed verifications.

A tenant's head is the end of its sealed chain: the last block's number and
seal. `chain_head()` returns it signed with the active audit key (HMAC over
the tenant, the head and the time); `manage.py audit_anchor` prints it and
`GET /api/v1/audit/head` serves it. An operator or an auditor keeps it where
the database's administrators cannot write (a ticket, a log shipped off the
machine) and hands it back later to `manage.py verify_audit --against FILE`
or `POST /api/v1/audit/verify`: the chain must still hold that very block,
which proves that no history up to it was rewritten, re-sealed or removed
since, even by someone who holds the audit key.

The same key signs each stored verification (`AuditVerification`), so a row
written behind the application's back (a forged "ok") is shown as unsigned.
"""

from __future__ import annotations

import datetime
import hmac
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from django.utils import timezone
from django.utils.dateparse import parse_datetime

from audit import sealing
from audit.models import AuditBlock, AuditVerification
from runs.crypto import AUDIT_KEYS_SETTING, audit_keyring, audit_mac
from runs.models import Tenant

_HEAD_TAG = "gatehouse.audit.head.v1"
_VERIFICATION_TAG = "gatehouse.audit.verification.v1"


class ChainHeadBroken(Exception):
    """The last block's seal does not verify: there is no head to sign."""


class InvalidHead(ValueError):
    """A saved head that this Gatehouse did not sign, or not for this tenant."""

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class SignedHead:
    tenant_id: int
    tenant: str
    head_seq: int
    head_hash: str
    signed_at: datetime.datetime
    key_id: str
    signature: str

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["signed_at"] = sealing.utc_text(self.signed_at)
        return data


def _head_payload(
    *,
    tenant_id: int,
    tenant: str,
    head_seq: int,
    head_hash: str,
    signed_at: datetime.datetime,
    key_id: str,
) -> bytes:
    return sealing.canonical(
        [
            _HEAD_TAG,
            tenant_id,
            tenant,
            head_seq,
            head_hash,
            sealing.utc_text(signed_at),
            key_id,
        ]
    )


def head_sign(*, tenant: Tenant, head_seq: int, head_hash: str) -> SignedHead:
    fields = {
        "tenant_id": tenant.pk,
        "tenant": tenant.slug,
        "head_seq": head_seq,
        "head_hash": head_hash,
        "signed_at": timezone.now(),
        "key_id": audit_keyring().active_id,
    }
    signature = audit_mac(_head_payload(**fields), key_id=fields["key_id"])
    return SignedHead(**fields, signature=signature)


def chain_head(*, tenant: Tenant) -> SignedHead:
    """The tenant's last sealed block (its seal checked), signed now.

    A chain with no block yet, or none since a retention purge, has the head
    it starts from: number 0 and the genesis hash, or the purge's record.
    """
    start, prev_hash = sealing.chain_start(tenant.pk)
    block = (
        AuditBlock.objects.for_tenant(tenant)
        .filter(last_seq__gte=start)
        .order_by("-last_seq")
        .first()
    )
    if block is None:
        return head_sign(tenant=tenant, head_seq=start - 1, head_hash=prev_hash)
    problem = sealing.seal_problem(
        tenant_id=tenant.pk,
        key_id=block.key_id,
        stored_hash=block.block_hash,
        allow_legacy=False,
        **sealing.block_fields(block),
    )
    if problem:
        raise ChainHeadBroken(problem)
    return head_sign(tenant=tenant, head_seq=block.last_seq, head_hash=block.block_hash)


def head_parse(data: Mapping[str, Any]) -> SignedHead:
    """A saved head as printed by audit_anchor or served by the API.

    InvalidHead naming the field when one is missing or malformed; the
    signature is checked by `head_check()`.
    """
    if not isinstance(data, Mapping):
        raise InvalidHead("a saved head is a JSON object", field="head")
    values: dict[str, Any] = {}
    for name, kind in (
        ("tenant_id", int),
        ("tenant", str),
        ("head_seq", int),
        ("head_hash", str),
        ("signed_at", str),
        ("key_id", str),
        ("signature", str),
    ):
        value = data.get(name)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise InvalidHead(f"{name} must be a {kind.__name__}", field=name)
        values[name] = value
    signed_at = parse_datetime(values["signed_at"])
    if signed_at is None or timezone.is_naive(signed_at):
        raise InvalidHead("signed_at must be an ISO 8601 instant", field="signed_at")
    values["signed_at"] = signed_at
    return SignedHead(**values)


def head_check(head: SignedHead, *, tenant: Tenant) -> None:
    """Raise InvalidHead unless this Gatehouse signed `head` for `tenant`."""
    if head.tenant_id != tenant.pk or head.tenant != tenant.slug:
        raise InvalidHead(
            f"the saved head is of tenant {head.tenant!r}, not {tenant.slug!r}",
            field="tenant",
        )
    fields = asdict(head)
    signature = fields.pop("signature")
    try:
        expected = audit_mac(_head_payload(**fields), key_id=head.key_id)
    except KeyError:
        raise InvalidHead(
            f"the saved head was signed with audit key {head.key_id!r}, which is "
            f"not in {AUDIT_KEYS_SETTING}",
            field="key_id",
        ) from None
    if not hmac.compare_digest(expected, signature):
        raise InvalidHead(
            "the saved head's signature does not verify: it was altered, or "
            "this Gatehouse did not issue it",
            field="signature",
        )


# --- Verifications ------------------------------------------------------------


def _verification_payload(verification: AuditVerification, key_id: str) -> bytes:
    return sealing.canonical(
        [
            _VERIFICATION_TAG,
            verification.tenant_id,
            sealing.utc_text(verification.checked_at),
            verification.ok,
            verification.blocks,
            verification.events,
            verification.unsealed,
            verification.first_bad_seq,
            verification.problem,
            verification.head_seq,
            verification.head_hash,
            verification.checked_by,
            verification.against_seq,
            verification.against_hash,
            key_id,
        ]
    )


def verification_sign(verification: AuditVerification) -> None:
    """Sign an unsaved verification in place with the active audit key."""
    key_id = audit_keyring().active_id
    verification.key_id = key_id
    verification.signature = audit_mac(
        _verification_payload(verification, key_id), key_id=key_id
    )


def verification_is_signed(verification: AuditVerification) -> bool:
    """Whether the row is as this Gatehouse wrote it."""
    if not verification.key_id:
        return False
    try:
        expected = audit_mac(
            _verification_payload(verification, verification.key_id),
            key_id=verification.key_id,
        )
    except KeyError:
        return False
    return hmac.compare_digest(expected, verification.signature)
