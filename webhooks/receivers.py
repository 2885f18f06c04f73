"""Webhooks react to committed audit events (audit.signals): no app that
changes state imports webhooks, and no change that rolled back is announced."""

from __future__ import annotations

from django.dispatch import receiver

from audit.signals import event_recorded
from webhooks import content
from webhooks.models import EVENTS
from webhooks.services import delivery_queue, event_body, subscriptions_at


@receiver(event_recorded, dispatch_uid="webhooks.subscriptions")
def queue_subscribed_deliveries(sender, *, event, **kwargs) -> None:
    if event.kind not in EVENTS:
        return
    for subscription in subscriptions_at(event, wanting=event.kind):
        with_content = subscription.include_content and content.run_values(event)
        if with_content:
            thread, values = with_content
            delivery_queue(
                subscription=subscription,
                event_type=event.kind,
                sealed=(thread, event_body(event, values=values)),
            )
        else:
            delivery_queue(
                subscription=subscription,
                event_type=event.kind,
                body=event_body(event),
            )
