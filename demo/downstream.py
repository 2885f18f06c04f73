"""Stand-ins for the downstream systems the demo agents talk to.

They behave like the real thing where it matters for durability: each one
deduplicates on the idempotency key it is given (a unique column, as a payment
API's Idempotency-Key header), so a call repeated with the same key returns
the first answer; and what the `fulfilment` agent does can be undone (stock
released, a charge refunded, a courier cancelled), each undo idempotent too.
"""

from __future__ import annotations

import time
from decimal import Decimal

from django.conf import settings
from django.db import connection
from django.utils import timezone

from demo.models import (
    DemoCharge,
    DemoCourierBooking,
    DemoCourierCall,
    DemoOutboxMessage,
    DemoPayment,
    DemoStockReservation,
)
from runs.crypto import ThreadCipher
from runs.fixed_queries import insert_statement, inserted, save_new
from runs.models import Thread


def _once(model, *, idempotency_key: str, **fields):
    """The row for `idempotency_key`: created now, or the one created first.

    One statement, in a transaction or out of one, as a provider's single
    insert: a repeated key inserts nothing (ON CONFLICT DO NOTHING, no
    savepoint to survive a duplicate's error), and the first row is read."""
    row = model(idempotency_key=idempotency_key, **fields)
    statement = insert_statement(row, ignore_conflicts=True)
    if statement is None:  # only Model.save may insert it
        created = save_new(row, ignore_conflicts=True)
    else:
        with connection.cursor() as cursor:
            cursor.execute(*statement)
            returned = cursor.fetchone()
        created = returned is not None
        if created:
            row.pk = returned[0]
            inserted(row)
    return row if created else model.objects.get(idempotency_key=idempotency_key)


def refund_payment(
    *, tenant_id: int, idempotency_key: str, order_id: str, amount: str, currency: str
) -> dict:
    """Refund `amount` on `order_id`; a repeated key returns the first refund."""
    payment = _once(
        DemoPayment,
        idempotency_key=idempotency_key,
        tenant_id=tenant_id,
        order_id=order_id,
        amount=Decimal(amount),
        currency=currency,
    )
    # A real provider answers after a network round trip; a latency setting lets
    # tests kill a worker between the provider's commit and the caller's record.
    latency = settings.GATEHOUSE_DEMO_PAYMENT_LATENCY
    if latency:
        time.sleep(latency)
    return {
        "payment_id": f"pay_{payment.pk}",
        "order_id": payment.order_id,
        "amount": str(payment.amount),
        "currency": payment.currency,
    }


def send_customer_message(
    *, thread: Thread, idempotency_key: str, kind: str, body: str
) -> dict:
    """Queue a message to the customer of `thread` (its row: the body is
    stored encrypted with its key); a repeated key sends nothing new."""
    cipher = ThreadCipher.for_thread(thread)
    message = _once(
        DemoOutboxMessage,
        idempotency_key=idempotency_key,
        tenant_id=thread.tenant_id,
        thread=thread,
        kind=kind,
        body=cipher.encrypt_value(body, row=("outbox", idempotency_key)),
    )
    return {"message_id": f"msg_{message.pk}", "kind": message.kind}


def _undo(model, reference: str, prefix: str, field: str) -> None:
    """Mark the row `reference` (prefix + pk) undone at most once: undoing
    twice changes nothing, as a real provider's refund of a refunded charge."""
    pk = int(reference.removeprefix(prefix))
    model.objects.filter(pk=pk, **{f"{field}__isnull": True}).update(
        **{field: timezone.now()}
    )
    # The provider answers after a round trip: a test kills a worker there.
    latency = settings.GATEHOUSE_DEMO_UNDO_LATENCY
    if latency:
        time.sleep(latency)


def reserve_stock(
    *, tenant_id: int, idempotency_key: str, order_id: str, lines: list[dict]
) -> dict:
    """Hold the order's lines in the warehouse."""
    reservation = _once(
        DemoStockReservation,
        idempotency_key=idempotency_key,
        tenant_id=tenant_id,
        order_id=order_id,
        lines=lines,
    )
    return {"reservation_id": f"res_{reservation.pk}", "order_id": order_id}


def release_stock(*, reservation_id: str) -> dict:
    """Put the reserved lines back on the shelf; releasing twice is a no-op."""
    _undo(DemoStockReservation, reservation_id, "res_", "released_at")
    return {"released": reservation_id}


def charge_card(
    *, tenant_id: int, idempotency_key: str, order_id: str, amount: str, currency: str
) -> dict:
    """Charge the customer's card on file for the order."""
    charge = _once(
        DemoCharge,
        idempotency_key=idempotency_key,
        tenant_id=tenant_id,
        order_id=order_id,
        amount=Decimal(amount),
        currency=currency,
    )
    return {
        "charge_id": f"ch_{charge.pk}",
        "amount": str(charge.amount),
        "currency": charge.currency,
    }


def refund_charge(*, charge_id: str) -> dict:
    """Refund a charge in full; refunding twice is a no-op."""
    _undo(DemoCharge, charge_id, "ch_", "refunded_at")
    return {"refunded": charge_id}


class CourierUnavailable(ConnectionError):
    """The courier's API did not answer (a 503): worth trying again."""


class CourierRefused(Exception):
    """The courier will not take the parcel: trying again changes nothing."""


def book_courier(
    *,
    tenant_id: int,
    idempotency_key: str,
    order_id: str,
    parcels: int,
    outages: int = 0,
    refuse: bool = False,
) -> dict:
    """Book a pickup. The order may ask the stand-in to be down for its first
    `outages` requests (CourierUnavailable), or to refuse it (CourierRefused)."""
    answered = DemoCourierCall.objects.filter(idempotency_key=idempotency_key).count()
    outcome = "unavailable" if answered < outages else "refused" if refuse else "booked"
    DemoCourierCall.objects.create(
        tenant_id=tenant_id, idempotency_key=idempotency_key, outcome=outcome
    )
    if outcome == "unavailable":
        raise CourierUnavailable("the courier's booking service is unavailable (503)")
    if outcome == "refused":
        raise CourierRefused(f"the courier refused order {order_id}: no service")
    booking = _once(
        DemoCourierBooking,
        idempotency_key=idempotency_key,
        tenant_id=tenant_id,
        order_id=order_id,
        parcels=parcels,
    )
    return {"booking_id": f"bk_{booking.pk}", "order_id": order_id}


def cancel_courier(*, booking_id: str) -> dict:
    """Cancel a pickup; cancelling twice is a no-op."""
    _undo(DemoCourierBooking, booking_id, "bk_", "cancelled_at")
    return {"cancelled": booking_id}
