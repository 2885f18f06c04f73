"""The redaction helper, and no personal data anywhere in the audit tables.

The end-to-end check on a refund run (a marker in the customer's message
leaves no trace) belongs with the refund agent; these tests hold the audit
side of it: what record() and describe() let through.
"""

import pytest
from django.db import connection
from django.test import override_settings

from audit import events
from audit.redaction import Described, describe, digest
from audit.sealing import seal_all
from audit.services import Actor, record, thread_tombstone_record
from tests.factories import make_tenant

MARKER = "ZEBRA-4417-PERSONAL"


def test_describe_digests_every_value_except_declared_safe_keys():
    described = describe(
        {"order_id": "A-1001", "amount": 40, "email": f"{MARKER}@example.com"},
        safe_keys={"order_id", "amount"},
    )
    assert isinstance(described, Described)
    assert described["order_id"] == "A-1001"
    assert described["amount"] == 40
    assert described["email"].startswith("hmac-sha256:")
    assert len(described["email"]) == len("hmac-sha256:") + 16
    assert MARKER not in str(described)


def test_a_safe_key_holding_an_object_or_long_text_is_digested_anyway():
    described = describe(
        {"order_id": {"customer": MARKER}, "note": MARKER * 20},
        safe_keys={"order_id", "note"},
    )
    assert described["order_id"].startswith("hmac-sha256:")
    assert described["note"].startswith("hmac-sha256:")


def test_equal_values_give_equal_digests_and_different_ones_differ():
    assert digest({"a": 1, "b": [2]}) == digest({"b": [2], "a": 1})
    assert digest("ann@example.com") != digest("bob@example.com")


def test_digests_are_keyed_so_a_list_of_candidates_does_not_reverse_them():
    plain = digest("ann@example.com")
    with override_settings(SECRET_KEY="another-secret-key-entirely-different"):
        assert digest("ann@example.com") != plain


@pytest.mark.django_db
def test_marker_in_arguments_leaves_no_trace_in_any_audit_row():
    tenant = make_tenant()
    args = {"order_id": "A-1001", "message": f"Hi, I am {MARKER}", "name": MARKER}
    record(
        tenant=tenant,
        kind=events.TENANT_CREATED,
        actor=Actor.agent("refund"),
        thread_id="case-1",
        action="refund_order",
        data={"slug": "x", "args": describe(args, safe_keys={"order_id"})},
    )
    thread_tombstone_record(
        tenant=tenant,
        thread_id="case-1",
        actor=Actor.system("retention"),
        requested_by=Actor.system("crm"),
        removed={"checkpoints": 3},
    )
    seal_all()
    with connection.cursor() as cursor:
        for table in ("audit_auditevent", "audit_auditblock"):
            cursor.execute(f"SELECT row_to_json(t)::text FROM {table} t")
            dumped = " ".join(row[0] for row in cursor.fetchall())
            assert dumped, table
            assert MARKER not in dumped
            assert "A-1001" in dumped or table == "audit_auditblock"


def test_digests_and_subject_indexes_keep_the_values_already_stored():
    """Both keys are derived with Django's salted_hmac now; the derivation is
    the one the stored digests and blind indexes were made with, so lookups
    of existing rows still match."""
    import hashlib
    import hmac

    from django.conf import settings

    from runs.services.threads import subject_hash

    def stored_form(salt: bytes, secret: str, message: str) -> str:
        key = hashlib.sha256(salt + secret.encode()).digest()
        return hmac.new(key, message.encode(), hashlib.sha256).hexdigest()

    assert subject_hash(" Jane.Doe@Example.com ") == stored_form(
        b"gatehouse-subject:", settings.SECRET_KEY, "jane.doe@example.com"
    )
    expected = stored_form(b"gatehouse.audit.digest\x00", settings.SECRET_KEY, '"x"')
    assert digest("x") == "hmac-sha256:" + expected[:16]
