"""Celery tasks of the webhooks app. Thin: the work is in webhooks.services."""

from celery import shared_task

from webhooks import services


@shared_task(name=services.DELIVER, acks_late=True, ignore_result=True)
def deliver(delivery_id: str) -> None:
    services.delivery_attempt(delivery_id)


@shared_task(name="webhooks.dispatch_due", ignore_result=True)
def dispatch_due() -> int:
    return services.deliveries_dispatch_due()
