"""The demo tables moved from `runs` to `demo` (runs 0005, demo 0001)."""

from decimal import Decimal

import pytest

from tests.migrations import migrate_to, migrate_to_latest

BEFORE = [("runs", "0004_beat_recover_stalled_runs")]

pytestmark = pytest.mark.django_db(transaction=True)


def test_demo_rows_survive_the_move_to_the_demo_app():
    old = migrate_to(BEFORE)
    tenant = old.get_model("runs", "Tenant").objects.create(slug="moved", name="M")
    thread = old.get_model("runs", "Thread").objects.create(
        tenant=tenant, thread_id="case-1", wrapped_data_key=b"k", data_key_id="k1"
    )
    old.get_model("runs", "DemoPayment").objects.create(
        tenant=tenant, idempotency_key="pay-1", order_id="A-1", amount="40.00"
    )
    old.get_model("runs", "DemoOutboxMessage").objects.create(
        tenant=tenant, thread=thread, idempotency_key="msg-1", kind="k", body=b"x"
    )

    new = migrate_to_latest()

    payment = new.get_model("demo", "DemoPayment").objects.get()
    assert (payment.idempotency_key, payment.amount) == ("pay-1", Decimal("40.00"))
    message = new.get_model("demo", "DemoOutboxMessage").objects.get()
    assert (message.thread_id, bytes(message.body)) == (thread.pk, b"x")
