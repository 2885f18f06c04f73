"""Server-side binding (config.settings) sends a statement's parameters apart
from its SQL, at most 65535 of them (config.postgresql): bulk writes go in
batches that fit, a client's list is bounded, and a statement libpq refuses
is an error of that statement, not a database outage."""

from __future__ import annotations

import os
import socket

import pytest
from django.db import OperationalError, connection

from runs.models import Thread
from runs.outages import is_database_outage
from tests.factories import make_tenant, tenant_with_client
from webhooks.models import WebhookDelivery

pytestmark = pytest.mark.django_db

ROWS = 7_000  # x 15 columns: more parameters than one statement takes


def _thread():
    tenant = make_tenant()
    return Thread.objects.create(tenant=tenant, thread_id="big", agent_name="refund")


def _deliveries(thread) -> list[WebhookDelivery]:
    return [
        WebhookDelivery(
            tenant_id=thread.tenant_id,
            thread=thread,
            event_type="run.succeeded",
            target="https://x",
            sealed_body=b"\x00",
        )
        for _ in range(ROWS)
    ]


def test_bulk_create_and_bulk_update_of_more_rows_than_parameters_fit():
    thread = _thread()
    deliveries = WebhookDelivery.objects.bulk_create(_deliveries(thread))
    for delivery in deliveries:
        delivery.status, delivery.attempts, delivery.last_error = "failed", 3, "x"
        delivery.target, delivery.event_type = "https://y", "run.failed"
    WebhookDelivery.objects.bulk_update(
        deliveries, ["status", "attempts", "last_error", "target", "event_type"]
    )
    rows = WebhookDelivery.objects.filter(thread=thread)
    assert rows.filter(status="failed", target="https://y").count() == ROWS
    assert len(WebhookDelivery.objects.in_bulk([d.pk for d in deliveries])) == ROWS


def test_a_statement_libpq_refuses_is_not_a_database_outage():
    with pytest.raises(OperationalError) as refused:
        list(Thread.objects.filter(pk__in=range(1, 70_001)))
    assert "65535" in str(refused.value)
    assert not is_database_outage(refused.value)
    assert Thread.objects.filter(pk__in=range(1, 10)).count() == 0  # still good


def test_a_connection_lost_mid_query_is_still_an_outage():
    """Lost without a word from the server (a network cut): psycopg raises
    OperationalError without a SQLSTATE, like the refused statement above,
    but the connection is bad, so it stays an outage."""
    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    # The socket shut under libpq: what a cut leaves it to find.
    socket.socket(fileno=os.dup(pgconn.socket)).shutdown(socket.SHUT_RDWR)
    with pytest.raises(OperationalError) as lost:
        Thread.objects.count()
    assert lost.value.__cause__.sqlstate is None
    assert is_database_outage(lost.value)
    connection.close()


def test_a_search_by_70k_thread_ids_is_refused_with_400():
    _, client = tenant_with_client()
    response = client.post(
        "/langgraph/threads/search",
        {"ids": [f"t-{i}" for i in range(70_000)], "limit": 10},
        format="json",
    )
    assert response.status_code == 400
    assert "ids" in response.json()["fields"]


def test_a_cancel_of_more_run_ids_than_a_page_is_refused_with_400():
    _, client = tenant_with_client()
    response = client.post(
        "/langgraph/runs/cancel",
        {"run_ids": ["00000000-0000-0000-0000-000000000000"] * 1001},
        format="json",
    )
    assert response.status_code == 400
    assert "run_ids" in response.json()["fields"]
