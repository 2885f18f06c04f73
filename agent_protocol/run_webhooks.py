"""A run's own webhook (the SDK's `webhook=`): registered with the run, posted
when the run ends, through the webhooks app (signed, retried, logged).

The message is LangGraph's: the run as `runs.get` shows it, with the thread's
values when the run ended (and its error, if it failed). It carries thread
content by design (the client asked for its run's result), so it is stored
encrypted with the thread's key until sent, and reading the values for it is
an audit event (`run.output_read`, how "webhook").
"""

from __future__ import annotations

from django.dispatch import receiver
from django.utils import timezone

from agent_protocol import shapes
from agent_protocol.models import RunWebhook
from audit import events
from audit.services import Actor
from audit.signals import event_recorded
from runs import selectors, services
from runs.crypto import ThreadCipher
from runs.errors import InvalidRequest
from runs.graphs import compile_for, thread_config
from runs.models import Run, Thread
from webhooks.services import (
    delivery_queue,
    endpoint_for,
    subscriptions_at,
    url_check,
)

RUN_ENDS = {
    events.RUN_SUCCEEDED.name,
    events.RUN_FAILED.name,
    events.RUN_INTERRUPTED.name,
    events.RUN_CANCELLED.name,
}
SENDER = Actor.system("webhooks")


def _row(run: Run) -> tuple:
    return ("run-webhook", str(run.id))


def run_webhook_register(*, run: Run, thread: Thread, url: str) -> RunWebhook:
    """Remember `url` for the run; refused unless the tenant subscribed an
    endpoint on its origin (Gatehouse posts results only where a tenant
    admin said it may)."""
    url_check(url)
    endpoint = endpoint_for(thread.tenant, url)
    if endpoint is None:
        raise InvalidRequest(
            "no webhook endpoint of this tenant is on that origin: subscribe one "
            "first (POST /api/v1/webhooks with events [] for run results only)",
            field="webhook",
        )
    return RunWebhook.objects.create(
        run=run,
        subscription=endpoint,
        sealed_url=ThreadCipher.for_thread(thread).encrypt_value(url, row=_row(run)),
    )


def _message(run: Run, thread: Thread) -> dict:
    values = compile_for(thread).get_state(thread_config(thread)).values
    body = {
        **shapes.run_of(run, thread),
        "values": selectors.jsonable(values),
        "webhook_sent_at": timezone.now(),
    }
    if run.status == Run.Status.FAILED:
        body["error"] = {
            "error": run.error_type,
            "message": selectors.run_error_text(run),
        }
    return selectors.jsonable(body)


@receiver(event_recorded, dispatch_uid="agent_protocol.run_webhooks")
def queue_run_webhook(sender, *, event, **kwargs) -> None:
    if event.kind not in RUN_ENDS or not event.run_id:
        return
    if not subscriptions_at(event):
        # A run's webhook posts through one of its tenant's subscriptions,
        # and goes with it (on_delete CASCADE): none, so no webhook to look up.
        return
    hook = (
        RunWebhook.objects.select_related("subscription", "run__thread__tenant")
        .filter(run_id=event.run_id, run__thread__deleted_at__isnull=True)
        .first()
    )
    if hook is None:
        return
    run, thread = hook.run, hook.run.thread
    url = ThreadCipher.for_thread(thread).decrypt_value(
        bytes(hook.sealed_url), row=_row(run)
    )
    services.run_output_read(run=run, thread=thread, actor=SENDER, how="webhook")
    delivery_queue(
        subscription=hook.subscription,
        event_type=event.kind,
        sealed=(thread, _message(run, thread)),
        run=run,
        target_url=url,
    )
