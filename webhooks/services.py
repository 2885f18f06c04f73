"""Webhook use cases: subscriptions, queueing deliveries, sending them.

Deliveries follow the Standard Webhooks specification (`webhook-id`,
`webhook-timestamp`, `webhook-signature`, signed by the `standardwebhooks`
library with the subscription's secret). They are sent by Celery tasks, never
from the request or the transaction that caused them:

1. a committed audit event of a kind a subscription asks for queues one
   delivery per subscription (webhooks.receivers); a run created with
   `webhook=` queues one when it ends (agent_protocol.receivers);
2. `delivery_attempt` claims the delivery (its next attempt is pushed past
   the request timeout, so a second task or the beat sweep leaves it alone),
   posts it, and records the answer: delivered on a 2xx; otherwise the next
   attempt after an exponential backoff, until GATEHOUSE_WEBHOOK_MAX_ATTEMPTS;
3. the beat job `webhooks.dispatch_due` sends what is due and was not sent
   (a lost task message, a worker killed mid-attempt).

At least once: a receiver may see a message twice (same `webhook-id`).
A target must be http(s) and, unless GATEHOUSE_WEBHOOK_ALLOW_PRIVATE, resolve
to public addresses only, checked when a subscription is made and again
before every attempt.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import socket
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

import httpx
from django.conf import settings
from django.db import transaction
from django.utils import timezone
from standardwebhooks.webhooks import Webhook

from audit import events
from audit.models import AuditEvent
from audit.services import Actor, once_per_commit, record
from runs import crypto
from runs.crypto import ThreadCipher
from runs.dispatch import task_send_on_commit
from runs.epochs import SharedEpoch
from runs.errors import InvalidRequest
from runs.fixed_queries import FixedQuery
from runs.models import Run, Tenant, Thread
from webhooks.models import EVENTS, WebhookDelivery, WebhookSubscription, origin

DELIVER = "webhooks.deliver"
SECRET_PREFIX = "whsec_"
USER_AGENT = "Gatehouse-Webhooks"


def _refuse(message: str):
    raise InvalidRequest(message, field="url")


def _addresses(host: str) -> set[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    try:
        return {ipaddress.ip_address(host)}
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        _refuse(f"{host} does not resolve")
    return {ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos}


def url_check(url: str) -> str:
    """The URL, if Gatehouse may post to it; InvalidRequest saying why not."""
    parts = urlsplit(url or "")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        _refuse("a webhook URL is http:// or https:// with a host")
    if parts.username or parts.password:
        _refuse("a webhook URL carries no credentials: the signature proves the sender")
    if settings.GATEHOUSE_WEBHOOK_ALLOW_PRIVATE:
        return url
    for address in _addresses(parts.hostname):
        if not address.is_global or address.is_multicast:
            _refuse(
                f"{parts.hostname} resolves to {address}, which is not a public "
                "address (GATEHOUSE_WEBHOOK_ALLOW_PRIVATE allows private ones)"
            )
    return url


def _check_events(names: list[str]) -> list[str]:
    unknown = sorted(set(names) - set(EVENTS))
    if unknown:
        raise InvalidRequest(
            f"unknown events {', '.join(unknown)}; known: {', '.join(EVENTS)}",
            field="events",
        )
    return sorted(set(names))


def _secret(subscription: WebhookSubscription) -> bytes:
    return crypto.unwrap_data_key(
        wrapped=bytes(subscription.wrapped_secret),
        key_id=subscription.secret_key_id,
        tenant_id=subscription.tenant_id,
        owner=subscription.secret_key_owner,
    )


def secret_text(subscription: WebhookSubscription) -> str:
    """The secret as a receiver configures it: "whsec_" + base64 of the key."""
    return SECRET_PREFIX + base64.b64encode(_secret(subscription)).decode()


# Content goes only where someone who may read it says (issue 16, finding 2).
CONTENT_REFUSED = (
    "include_content sends thread content to the endpoint: only a caller who may "
    "read decrypted content (an integration's service key with the runs scope) "
    "may ask for it, not a tenant admin"
)


@dataclass(frozen=True)
class IssuedSubscription:
    subscription: WebhookSubscription
    secret: str  # shown once: "whsec_" + base64 of the key


@transaction.atomic
def subscription_create(
    *,
    tenant: Tenant,
    url: str,
    events_wanted: list[str],
    actor: Actor,
    include_content: bool = False,
) -> IssuedSubscription:
    subscription = WebhookSubscription(
        tenant=tenant,
        url=url_check(url),
        events=_check_events(events_wanted),
        include_content=include_content,
        created_by=actor.label,
    )
    # The id is chosen before the row is saved: the wrap is bound to it.
    key = crypto.new_data_key(tenant_id=tenant.pk, owner=subscription.secret_key_owner)
    subscription.wrapped_secret = key.wrapped
    subscription.secret_key_id = key.key_id
    subscription.save(force_insert=True)
    record(
        tenant=tenant,
        kind=events.WEBHOOK_SUBSCRIBED,
        actor=actor,
        data={
            "target": subscription.origin,
            "events": ", ".join(subscription.events) or "runs' own webhooks only",
            "include_content": include_content,
        },
    )
    return IssuedSubscription(
        subscription=subscription, secret=secret_text(subscription)
    )


@transaction.atomic
def subscription_delete(*, subscription: WebhookSubscription, actor: Actor) -> None:
    record(
        tenant=subscription.tenant,
        kind=events.WEBHOOK_UNSUBSCRIBED,
        actor=actor,
        data={"target": subscription.origin},
    )
    subscription.delete()


def endpoint_for(tenant: Tenant, url: str) -> WebhookSubscription | None:
    """The tenant's subscription at the URL's origin: the receiver a run's own
    webhook may post to, and whose secret signs it."""
    wanted = origin(url)
    return next(
        (
            subscription
            for subscription in WebhookSubscription.objects.for_tenant(tenant)
            if subscription.origin == wanted
        ),
        None,
    )


# Read after every commit that records an event, by workers and web
# processes alike: compiled once per process (runs.fixed_queries). The
# sample is a tenant id no tenant has.
_TENANT_SUBSCRIPTIONS = FixedQuery(
    lambda tenant_id: WebhookSubscription.objects.filter(tenant_id=tenant_id),
    -1_000_003,
)


# What this process knows of each tenant's subscriptions without reading
# them: the events they want, or None when the tenant has none; kept under
# the subscriptions' epoch (runs.epochs), which every subscription saved or
# deleted replaces, in whichever process. Most tenants have none, and most
# commits record an event a subscription could want: here that costs a GET
# in Redis, not a query. Only what no subscription wants is skipped: a
# deleted subscription is never posted to, its rows are read. Read again at
# least this often, whatever the epoch says: a bound on how late a
# subscription made where the epoch cannot be replaced (a shell whose
# CACHE_URL is not the web's Redis, a write that sends no signal) is seen.
MAX_AGE_SECONDS = 60
MAX_TENANTS = 10_000


@dataclass(frozen=True)
class _Kept:
    epoch: int
    read_at: float
    events: frozenset[str] | None


_kept: OrderedDict[int, _Kept] = OrderedDict()
_kept_lock = threading.Lock()


def _forget() -> None:
    with _kept_lock:
        _kept.clear()


SUBSCRIPTIONS_EPOCH = SharedEpoch("gatehouse:webhook-epoch", forget=_forget)


class _TenantSubscriptions:
    """A tenant's subscriptions as one commit's receivers see them: the
    epoch read once, the rows read at most once, and only when what this
    process keeps does not already say that none wants the event."""

    def __init__(self, tenant_id: int) -> None:
        self.tenant_id = tenant_id
        # Read before the rows: a change that commits after it replaces it.
        self.epoch = SUBSCRIPTIONS_EPOCH.current()
        with _kept_lock:
            kept = _kept.get(tenant_id) if self.epoch is not None else None
        self.known = (
            kept is not None
            and kept.epoch == self.epoch
            and time.monotonic() - kept.read_at <= MAX_AGE_SECONDS
        )
        self.events = kept.events if self.known else None
        self._rows: list[WebhookSubscription] | None = None

    def none_wants(self, kind: str | None) -> bool:
        return self.known and (
            self.events is None or (kind is not None and kind not in self.events)
        )

    def rows(self) -> list[WebhookSubscription]:
        if self._rows is None:
            self._rows = _TENANT_SUBSCRIPTIONS(self.tenant_id)
            if self.epoch is not None:
                events = (
                    frozenset(e for s in self._rows for e in s.events)
                    if self._rows
                    else None
                )
                with _kept_lock:
                    _kept[self.tenant_id] = _Kept(self.epoch, time.monotonic(), events)
                    _kept.move_to_end(self.tenant_id)
                    while len(_kept) > MAX_TENANTS:
                        _kept.popitem(last=False)
        return self._rows


def subscriptions_at(
    event: AuditEvent, wanting: str | None = None
) -> list[WebhookSubscription]:
    """The tenant's subscriptions when `event` is announced; with `wanting`,
    those that want that kind of event. Looked up once for all the events its
    transaction committed (audit.services.once_per_commit), and not read at
    all when this process knows that none (that wants it) exists."""
    tenant_id = event.tenant_id
    found = once_per_commit(
        event,
        ("webhook-subscriptions", tenant_id),
        lambda: _TenantSubscriptions(tenant_id),
    )
    if found.none_wants(wanting):
        return []
    return [s for s in found.rows() if wanting is None or wanting in s.events]


def _sealed_row(delivery: WebhookDelivery, part: str) -> tuple:
    return ("webhook-delivery", str(delivery.id), part)


def delivery_queue(
    *,
    subscription: WebhookSubscription,
    event_type: str,
    body: dict[str, Any] | None = None,
    sealed: tuple[Thread, dict[str, Any]] | None = None,
    run: Run | None = None,
    target_url: str | None = None,
) -> WebhookDelivery:
    """Queue one message to `subscription`'s endpoint, or to `target_url` on
    its origin (a run's own webhook). `body` holds no thread content;
    `sealed` is (thread, body) for one that does, stored encrypted."""
    delivery = WebhookDelivery(
        tenant_id=subscription.tenant_id,
        subscription=subscription,
        run=run,
        event_type=event_type,
        target=origin(target_url or subscription.url),
        body=body,
    )
    if sealed is not None or target_url is not None:
        thread, sealed_body = sealed if sealed is not None else (run.thread, body)
        cipher = ThreadCipher.for_thread(thread)
        delivery.thread = thread
        delivery.body = None
        delivery.sealed_body = cipher.encrypt_value(
            {"url": target_url, "body": sealed_body},
            row=_sealed_row(delivery, "body"),
        )
    with transaction.atomic():
        delivery.save()
        task_send_on_commit(DELIVER, str(delivery.id))
    return delivery


def event_body(event: AuditEvent, **extra: Any) -> dict[str, Any]:
    """A subscription's message for an audit event: what the trail says, no more."""
    return {
        "type": event.kind,
        "timestamp": event.occurred_at.isoformat(),
        "data": {
            "tenant": event.tenant.slug,
            "event_seq": event.seq,
            "thread_id": event.thread_id or None,
            "run_id": event.run_id or None,
            "action": event.action or None,
            "actor": event.actor_label,
            "summary": event.summary,
            "details": event.data,
            **extra,
        },
    }


def _backoff(attempts: int) -> timedelta:
    base = settings.GATEHOUSE_WEBHOOK_RETRY_SECONDS
    return timedelta(seconds=min(base * 2 ** (attempts - 1), 3600))


def _claim(delivery_id) -> WebhookDelivery | None:
    """Take a due delivery for one attempt."""
    with transaction.atomic():
        delivery = (
            WebhookDelivery.objects.select_for_update(skip_locked=True, of=("self",))
            .select_related("subscription", "thread__tenant")
            .filter(
                pk=delivery_id,
                status=WebhookDelivery.Status.PENDING,
                next_attempt_at__lte=timezone.now(),
            )
            .first()
        )
        if delivery is None:
            return None
        delivery.attempts += 1
        # Nobody else attempts it while this attempt may still be under way.
        delivery.next_attempt_at = timezone.now() + timedelta(
            seconds=2 * settings.GATEHOUSE_WEBHOOK_TIMEOUT_SECONDS
        )
        delivery.save(update_fields=["attempts", "next_attempt_at"])
        return delivery


class Undeliverable(Exception):
    """The delivery can never be sent (its thread or endpoint is gone)."""


def _message(delivery: WebhookDelivery) -> tuple[str, bytes]:
    """The target URL and the body to post."""
    if delivery.subscription is None:
        raise Undeliverable("the subscription was deleted")
    if delivery.body is None and delivery.sealed_body is None:
        raise Undeliverable("its content was removed with its thread")
    if delivery.sealed_body is None:
        return delivery.subscription.url, json.dumps(delivery.body).encode()
    if delivery.thread is None or delivery.thread.is_shredded:
        raise Undeliverable("the thread was deleted")
    sealed = ThreadCipher.for_thread(delivery.thread).decrypt_value(
        bytes(delivery.sealed_body), row=_sealed_row(delivery, "body")
    )
    return sealed["url"] or delivery.subscription.url, json.dumps(
        sealed["body"]
    ).encode()


def _post(delivery: WebhookDelivery, url: str, body: bytes) -> httpx.Response:
    url_check(url)  # again: where a name points can change
    sent_at = timezone.now()
    signature = Webhook(_secret(delivery.subscription)).sign(
        msg_id=delivery.message_id, timestamp=sent_at, data=body.decode()
    )
    return httpx.post(
        url,
        content=body,
        headers={
            "content-type": "application/json",
            "user-agent": USER_AGENT,
            "webhook-id": delivery.message_id,
            "webhook-timestamp": str(int(sent_at.timestamp())),
            "webhook-signature": signature,
        },
        timeout=settings.GATEHOUSE_WEBHOOK_TIMEOUT_SECONDS,
        follow_redirects=False,
    )


def delivery_attempt(delivery_id) -> WebhookDelivery | None:
    """One attempt at a due delivery; the next one scheduled if it failed."""
    delivery = _claim(delivery_id)
    if delivery is None:
        return None
    status_code, error = None, ""
    try:
        url, body = _message(delivery)
        status_code = _post(delivery, url, body).status_code
        if not 200 <= status_code < 300:
            error = f"HTTP {status_code}"
    except Undeliverable as gone:
        error, delivery.attempts = str(gone), settings.GATEHOUSE_WEBHOOK_MAX_ATTEMPTS
    except InvalidRequest as refused:
        error = str(refused.detail.get("url", ["refused"])[0])[:300]
    except (httpx.HTTPError, crypto.CryptoError) as failure:
        error = type(failure).__name__
    now = timezone.now()
    delivery.last_status_code = status_code
    delivery.last_error = error[:300]
    if not error:
        delivery.status = WebhookDelivery.Status.DELIVERED
        delivery.delivered_at = now
    elif delivery.attempts >= settings.GATEHOUSE_WEBHOOK_MAX_ATTEMPTS:
        delivery.status = WebhookDelivery.Status.FAILED
    else:
        delay = _backoff(delivery.attempts)
        delivery.next_attempt_at = now + delay
        task_send_on_commit(DELIVER, str(delivery.id), countdown=delay.total_seconds())
    with transaction.atomic():
        delivery.save(
            update_fields=[
                "status",
                "attempts",
                "last_status_code",
                "last_error",
                "next_attempt_at",
                "delivered_at",
            ]
        )
    return delivery


def deliveries_dispatch_due(*, limit: int = 500) -> int:
    """Send the pending deliveries whose attempt is due (the beat sweep)."""
    due = list(
        WebhookDelivery.objects.filter(
            status=WebhookDelivery.Status.PENDING, next_attempt_at__lte=timezone.now()
        )
        .order_by("next_attempt_at")
        .values_list("id", flat=True)[:limit]
    )
    for delivery_id in due:
        task_send_on_commit(DELIVER, str(delivery_id))
    return len(due)
