"""Outages of Postgres and the broker, one process at a time (issue 16, items
10 and 11): beat outlives them, the API answers 503 and never 500, work it
accepted stays accepted, a worker's lost connection is not the agent's
failure, and workers sweep stalled runs without beat.

The database is made unreachable for this process by pointing its
connection at a port where nothing listens, and the broker likewise: real
connection failures, without stopping the shared services. The suite's
whole-stack fault test (tests/deployment/test_faults.py) restarts a Postgres
and a Redis of its own.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from datetime import timedelta

import psycopg
import pytest
from celery import current_app
from django.db import OperationalError, connection
from django.test import Client
from django.utils import timezone
from django_celery_beat.models import IntervalSchedule, PeriodicTask
from django_celery_beat.schedulers import DatabaseScheduler

from audit.models import AuditEvent
from runs.beat import OutageTolerantScheduler
from runs.dispatch import _SWEEP_LOCK, runs_recover_stalled
from runs.models import Run
from runs.outages import RETRY_AFTER_SECONDS
from runs.selectors import stalled_runs
from tests import workers
from tests.approvals.helpers import logged_in, wait_run, waiting_request
from tests.deployment.processes import free_port
from tests.factories import (
    api_client,
    make_api_key,
    make_member,
    make_tenant,
    tenant_with_client,
)
from tests.workers import Worker, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@contextmanager
def database_unreachable():
    """This process's new connections go to a closed port until the block
    ends; the open one is dropped."""
    params = connection.settings_dict  # shared by every thread's connection
    port = params["PORT"]
    connection.close()
    params["PORT"] = str(free_port())
    try:
        yield
    finally:
        params["PORT"] = port
        connection.close()


@contextmanager
def broker_unreachable():
    """This process publishes to a closed port until the block ends."""
    conf = current_app.conf
    url = conf.broker_write_url
    conf.broker_write_url = f"redis://127.0.0.1:{free_port()}/0"
    _forget_broker_connections()
    try:
        yield
    finally:
        conf.broker_write_url = url
        _forget_broker_connections()


def _forget_broker_connections() -> None:
    # Kombu keeps pools per broker URL; the app picks the URL's pool again.
    current_app._pool = None
    current_app.amqp._producer_pool = None


def _backend_pids() -> list[int]:
    """Every other connection to the test database: the worker's."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid()"
        )
        return [pid for (pid,) in cursor.fetchall()]


def _terminate(pids: list[int]) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))"
            " FROM unnest(%s::int[]) AS pid",
            [pids],
        )
        return cursor.fetchone()[0]


# --- beat --------------------------------------------------------------------------


def test_beat_outlives_the_database_going_away_at_its_full_sync():
    every, _ = IntervalSchedule.objects.get_or_create(every=15, period="seconds")
    PeriodicTask.objects.create(
        name="recover", task="runs.recover_stalled_runs", interval=every
    )
    scheduler = OutageTolerantScheduler(app=current_app)
    assert "recover" in scheduler.schedule
    with database_unreachable():
        # django-celery-beat re-reads the whole schedule every 5 minutes.
        scheduler._last_full_sync -= timedelta(seconds=301)
        with pytest.raises(OperationalError):
            DatabaseScheduler.tick(scheduler)  # what ended beat in the issue
        scheduler._last_full_sync -= timedelta(seconds=301)
        assert scheduler.tick() == RETRY_AFTER_SECONDS
        assert scheduler.tick() == RETRY_AFTER_SECONDS  # still down: still alive
    scheduler.tick()  # the database is back: the schedule is read again
    assert "recover" in scheduler.schedule
    assert scheduler._heap


# --- the API and the admin ---------------------------------------------------------


def test_the_api_answers_503_with_retry_after_while_the_database_is_down():
    _, api = tenant_with_client()
    with database_unreachable():
        listed = api.get("/api/v1/threads")
        created = api.post(
            "/api/v1/threads",
            {"thread_id": "t1", "agent": "echo"},
            format="json",
            HTTP_IDEMPOTENCY_KEY="k1",
        )
    for response in (listed, created):
        assert response.status_code == 503
        assert response["Retry-After"] == str(RETRY_AFTER_SECONDS)
        assert response.json()["code"] == "service_unavailable"
    # Nothing was reserved under the key: the retry does the work.
    retried = api.post(
        "/api/v1/threads",
        {"thread_id": "t1", "agent": "echo"},
        format="json",
        HTTP_IDEMPOTENCY_KEY="k1",
    )
    assert retried.status_code == 201


def test_a_request_the_database_drops_half_way_leaves_its_key_free():
    """Postgres goes away after the key was reserved, while the work is being
    written (the request's connection is cut, and no new one can be made
    until the request has ended): the reservation goes with the work, so the
    retry with the same key does the work, instead of 409
    idempotency_in_progress until the key expires."""
    _, api = tenant_with_client()
    body = {"thread_id": "t1", "agent": "echo"}
    params = connection.settings_dict
    port = params["PORT"]
    cuts = []

    def postgres_goes_away_while_the_thread_is_written(
        execute, sql, params_, many, context
    ):
        # The row goes in with its thread.created event, one statement (e7a9922).
        if 'INSERT INTO "runs_thread"' in sql and not cuts:
            own_pid = context["connection"].connection.info.backend_pid
            with psycopg.connect(
                workers.suite_database_url(), autocommit=True
            ) as other:
                cuts.append(
                    other.execute(
                        "SELECT pg_terminate_backend(%s)", [own_pid]
                    ).fetchone()[0]
                )
            params["PORT"] = str(free_port())
        return execute(sql, params_, many, context)

    try:
        with connection.execute_wrapper(postgres_goes_away_while_the_thread_is_written):
            dropped = api.post(
                "/api/v1/threads", body, format="json", HTTP_IDEMPOTENCY_KEY="k1"
            )
    finally:
        params["PORT"] = port
        connection.close()
    assert cuts == [True]
    assert dropped.status_code == 503, dropped.content
    retried = api.post(
        "/api/v1/threads", body, format="json", HTTP_IDEMPOTENCY_KEY="k1"
    )
    assert retried.status_code == 201, retried.content
    replayed = api.post(
        "/api/v1/threads", body, format="json", HTTP_IDEMPOTENCY_KEY="k1"
    )
    assert replayed["Idempotent-Replayed"] == "true"
    assert replayed.json() == retried.json()


def test_the_admin_and_the_agent_protocol_answer_503_while_the_database_is_down():
    tenant, _ = tenant_with_client()
    reviewer = logged_in(make_member(tenant, role="reviewer").user)
    anonymous = Client(raise_request_exception=False)
    session = Client(raise_request_exception=False)
    session.cookies = reviewer.cookies
    with database_unreachable():
        answers = {
            "admin page": session.get("/admin/approvals/approvalrequest/"),
            "admin login": anonymous.post(
                "/admin/login/", {"username": "x", "password": "y"}
            ),
            "agent protocol": anonymous.post(
                "/langgraph/threads/search",
                "{}",
                content_type="application/json",
                HTTP_X_API_KEY="gh_unknown.secret",
            ),
        }
    for name, response in answers.items():
        assert response.status_code == 503, (name, response.content[:300])
        assert response["Retry-After"] == str(RETRY_AFTER_SECONDS), name
    assert answers["agent protocol"].json()["code"] == "service_unavailable"


# --- the broker --------------------------------------------------------------------


@pytest.mark.worker
def test_a_run_accepted_while_the_broker_is_down_is_swept_to_a_worker():
    """No beat here: the worker's own sweep dispatches the run whose message
    was never sent."""
    _, api = tenant_with_client()
    api.post("/api/v1/threads", {"thread_id": "t1", "agent": "echo"}, format="json")
    body = {"input": {"text": "hello"}}
    with broker_unreachable():
        first = api.post(
            "/api/v1/threads/t1/runs", body, format="json", HTTP_IDEMPOTENCY_KEY="r1"
        )
        again = api.post(
            "/api/v1/threads/t1/runs", body, format="json", HTTP_IDEMPOTENCY_KEY="r1"
        )
    assert first.status_code == 202, first.content
    assert again.status_code == 202 and again["Idempotent-Replayed"] == "true"
    assert again.json() == first.json()
    run_id = first.json()["run_id"]
    assert Run.objects.get(pk=run_id).status == "queued"
    sweeper = Worker(name="sweeper", env={"GATEHOUSE_RECOVERY_SWEEP_SECONDS": "1"})
    try:
        wait_run(api, "t1", run_id, "succeeded", timeout=60)
    finally:
        sweeper.stop()
    assert "recover_stalled_runs" in sweeper.output()


def test_a_decision_accepted_while_the_broker_is_down_stands_and_replays():
    """The issue's 500 and then 409 already_decided: the decision is answered
    200, replayed under its key, and its resume run waits for the sweep."""
    tenant = make_tenant()
    approval = waiting_request(tenant)
    _, secret = make_api_key(tenant, ["approvals"])
    client = api_client(secret)
    url = f"/api/v1/approvals/{approval.pk}/decision"
    body = {"approved": True, "note": "Photo checked."}
    with broker_unreachable():
        first = client.post(url, body, format="json", HTTP_IDEMPOTENCY_KEY="d1")
        again = client.post(url, body, format="json", HTTP_IDEMPOTENCY_KEY="d1")
    assert first.status_code == 200, first.content
    assert again.status_code == 200 and again["Idempotent-Replayed"] == "true"
    assert again.json() == first.json()
    resumed = Run.objects.get(kind="resume")
    assert resumed.status == "queued"
    later = timezone.now() + timedelta(hours=1)
    assert stalled_runs(limit=10, now=later).lost_messages == [resumed.pk]


def test_one_sweep_at_a_time():
    _, api = tenant_with_client()
    api.post("/api/v1/threads", {"thread_id": "t1", "agent": "echo"}, format="json")
    with broker_unreachable():
        api.post("/api/v1/threads/t1/runs", {"input": {}}, format="json")
    Run.objects.update(created_at=Run.objects.get().created_at - timedelta(hours=1))
    with psycopg.connect(workers.suite_database_url(), autocommit=True) as other:
        other.execute("SELECT pg_advisory_lock(%s)", [_SWEEP_LOCK])
        assert runs_recover_stalled() == {"expired_leases": 0, "stalled_queued": 0}
        other.execute("SELECT pg_advisory_unlock(%s)", [_SWEEP_LOCK])
    with broker_unreachable():  # found and sent (the send fails, is logged)
        assert runs_recover_stalled() == {"expired_leases": 0, "stalled_queued": 1}


# --- a worker's lost connections ---------------------------------------------------


@pytest.mark.worker
def test_a_worker_that_loses_its_connections_mid_run_carries_on(worker):
    """Every connection of the worker is cut, again and again, while a run of
    five steps runs: the run succeeds in its first attempt, each step once."""
    _, api = tenant_with_client()
    api.post("/api/v1/threads", {"thread_id": "t1", "agent": "slow"}, format="json")
    run_id = api.post("/api/v1/threads/t1/runs", {"input": {}}, format="json").json()[
        "run_id"
    ]
    wait_for(
        lambda: Run.objects.get(pk=run_id).status == "running",
        what="the run to start",
    )
    # Cut for as long as the run takes on an idle machine (about 4 s), not
    # until it ends: under load a reconnect and a step can outlast the 0.3 s
    # between cuts, and cutting on would then let no step through.
    cut, cutting_until = 0, time.monotonic() + 8
    while (
        time.monotonic() < cutting_until
        and Run.objects.get(pk=run_id).status == "running"
    ):
        cut += _terminate(_backend_pids())
        time.sleep(0.3)  # time to reconnect and write a little
    assert cut, "no connection of the worker was cut"
    wait_for(
        lambda: Run.objects.get(pk=run_id).status != "running",
        timeout=60,
        what="the run to end",
    )
    assert Run.objects.get(pk=run_id).status == "succeeded"
    run = Run.objects.get(pk=run_id)
    assert run.attempts == 1
    state = api.get("/api/v1/threads/t1/state").json()["values"]
    assert state["ticks"] == [1, 2, 3, 4, 5]
    assert not AuditEvent.objects.filter(kind__in=["run.failed", "run.recovered"])
