"""Stand-ins for the downstream systems the demo agent talks to.

They behave like the real thing where it matters for durability: the payments
provider deduplicates on the idempotency key it is given (a unique column, as a
payment API's Idempotency-Key header), and so does the outbox.
"""

from __future__ import annotations

import time
from decimal import Decimal

from django.conf import settings
from django.db import IntegrityError, transaction

from demo.models import DemoOutboxMessage, DemoPayment
from runs.crypto import ThreadCipher
from runs.models import Thread


def refund_payment(
    *, tenant_id: int, idempotency_key: str, order_id: str, amount: str, currency: str
) -> dict:
    """Refund `amount` on `order_id`; a repeated key returns the first refund."""
    try:
        with transaction.atomic():
            payment = DemoPayment.objects.create(
                tenant_id=tenant_id,
                idempotency_key=idempotency_key,
                order_id=order_id,
                amount=Decimal(amount),
                currency=currency,
            )
    except IntegrityError:
        payment = DemoPayment.objects.get(idempotency_key=idempotency_key)
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
    *, thread_pk: int, idempotency_key: str, kind: str, body: str
) -> dict:
    """Queue a message to the customer; a repeated key sends nothing new."""
    thread = Thread.objects.get(pk=thread_pk)
    cipher = ThreadCipher.for_thread(thread)
    try:
        with transaction.atomic():
            message = DemoOutboxMessage.objects.create(
                tenant_id=thread.tenant_id,
                thread=thread,
                idempotency_key=idempotency_key,
                kind=kind,
                body=cipher.encrypt_value(body, row=("outbox", idempotency_key)),
            )
    except IntegrityError:
        message = DemoOutboxMessage.objects.get(idempotency_key=idempotency_key)
    return {"message_id": f"msg_{message.pk}", "kind": message.kind}
