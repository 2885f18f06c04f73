"""Webhook deliveries from a live Gatehouse (the production server and a real
worker) to a receiver in the test, verified with the Standard Webhooks
library's own verifier."""

from __future__ import annotations

import json

import httpx
import pytest
from standardwebhooks.webhooks import Webhook

from tests.workers import wait_for
from webhooks.models import WebhookDelivery

pytestmark = pytest.mark.worker


def subscribe(server, client, url: str, events: list[str], **extra) -> str:
    """Subscribe `url` over /api/v1/webhooks with the client's key; its secret."""
    response = httpx.post(
        f"{server.url}/api/v1/webhooks",
        json={"url": url, "events": events, **extra},
        headers={"Authorization": f"Bearer {client.http.client.headers['x-api-key']}"},
    )
    assert response.status_code == 201, response.text
    return response.json()["secret"]


def delivered(receiver, count: int):
    return wait_for(
        lambda: len(receiver.received) >= count and receiver.received,
        what=f"{count} webhook request(s)",
    )


def test_run_webhook_posts_one_signed_message_with_the_runs_result(
    gatehouse_server, sdk, receiver
):
    client = sdk()
    secret = subscribe(gatehouse_server, client, receiver.url, [])
    thread_id = client.threads.create(metadata={"graph_id": "echo"})["thread_id"]
    run = client.runs.create(
        thread_id,
        "echo",
        input={"text": "hook me"},
        webhook=f"{receiver.url}/results?token=t1",
    )
    client.runs.join(thread_id, run["run_id"])
    [message] = delivered(receiver, 1)
    payload = Webhook(secret).verify(message.body, message.headers)
    assert message.path == "/results?token=t1"
    assert payload["run_id"] == run["run_id"] and payload["status"] == "success"
    assert payload["values"] == {"text": "hook me", "echoed": "hook me"}
    delivery = WebhookDelivery.objects.get(run_id=run["run_id"])
    wait_for(
        lambda: WebhookDelivery.objects.get(pk=delivery.pk).status == "delivered",
        what="the delivery to be recorded",
    )
    assert len(receiver.received) == 1
    # The log holds no content: the body is sealed with the thread's key.
    delivery.refresh_from_db()
    assert delivery.body is None and b"hook me" not in bytes(delivery.sealed_body)
    assert delivery.target == receiver.url


def test_a_failing_receiver_is_retried_with_the_same_message_id(
    gatehouse_server, sdk, receiver
):
    receiver.fail_first = 2
    client = sdk()
    secret = subscribe(gatehouse_server, client, receiver.url, [])
    thread_id = client.threads.create(metadata={"graph_id": "echo"})["thread_id"]
    client.runs.wait(
        thread_id, "echo", input={"text": "again"}, webhook=f"{receiver.url}/r"
    )
    messages = delivered(receiver, 3)
    assert len({m.headers["webhook-id"] for m in messages}) == 1
    for message in messages:
        assert Webhook(secret).verify(message.body, message.headers)["values"] == {
            "text": "again",
            "echoed": "again",
        }
    delivery = wait_for(
        lambda: WebhookDelivery.objects.filter(
            tenant=client.tenant, status="delivered"
        ).first(),
        what="the delivery to be recorded delivered",
    )
    assert delivery.attempts == 3 and delivery.last_status_code == 204


def test_a_run_webhook_to_an_unsubscribed_origin_is_refused(sdk, receiver):
    client = sdk()
    thread_id = client.threads.create(metadata={"graph_id": "echo"})["thread_id"]
    with pytest.raises(httpx.HTTPStatusError) as refused:
        client.runs.create(
            thread_id, "echo", input={"text": "x"}, webhook=f"{receiver.url}/r"
        )
    assert refused.value.response.status_code == 400
    assert "webhook" in refused.value.response.json()["fields"]


def test_subscribed_events_arrive_signed_without_thread_content(
    gatehouse_server, sdk, receiver
):
    client = sdk()
    secret = subscribe(
        gatehouse_server,
        client,
        f"{receiver.url}/events",
        ["run.interrupted", "approval.requested", "run.succeeded"],
    )
    thread_id = client.threads.create(metadata={"graph_id": "gate"})["thread_id"]
    client.runs.wait(thread_id, "gate", input={})
    messages = delivered(receiver, 2)
    payloads = [Webhook(secret).verify(m.body, m.headers) for m in messages]
    assert sorted(p["type"] for p in payloads) == [
        "approval.requested",
        "run.interrupted",
    ]
    for payload in payloads:
        assert payload["data"]["thread_id"] == thread_id
        assert "because one" not in json.dumps(payload)  # the request's reason


def test_include_content_adds_the_threads_values_to_run_events(
    gatehouse_server, sdk, receiver
):
    client = sdk()
    secret = subscribe(
        gatehouse_server, client, receiver.url, ["run.succeeded"], include_content=True
    )
    thread_id = client.threads.create(metadata={"graph_id": "echo"})["thread_id"]
    client.runs.wait(thread_id, "echo", input={"text": "shared"})
    [message] = delivered(receiver, 1)
    payload = Webhook(secret).verify(message.body, message.headers)
    assert payload["data"]["values"] == {"text": "shared", "echoed": "shared"}
