"""GET /api/v1/threads/{id}/runs/{run}?wait=<seconds>: the run's detail once
it stops (interrupted, succeeded, failed, cancelled) or when the wait runs
out, from the production server (tests/servers.py) and a real worker; its
refusals in-process; and runs.streaming.stopped, its wait (on
until_stopped, as the Agent Protocol's join), on the Redis log and on the
database log."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from asgiref.sync import async_to_sync
from django.conf import settings
from django.utils import timezone

from audit.models import AuditEvent
from runs import streaming
from runs.crypto import ThreadCipher
from runs.models import Run
from tests.factories import make_api_key, make_tenant, tenant_with_client
from tests.runs.test_outages import broker_unreachable, database_unreachable
from tests.servers import LiveServer
from tests.workers import wait_for

# A web process with a pool of two connections: waiting requests that held
# theirs would leave none for the next request (test_waiting_holds_no_...).
POOL = {"DATABASE_POOL_MIN_SIZE": "1", "DATABASE_POOL_MAX_SIZE": "2"}


@pytest.fixture(scope="module")
def web(django_db_setup, _worker_process):
    server = LiveServer(workers=1, env=POOL, name="run-wait")
    yield server
    server.stop()


@pytest.fixture
def client(transactional_db, web, worker):
    tenant = make_tenant()
    _, secret = make_api_key(tenant)
    with httpx.Client(
        base_url=f"{web.url}/api/v1",
        headers={"Authorization": f"Bearer {secret}"},
        timeout=60,
    ) as http:
        http.tenant, http.root = tenant, web.url
        yield http


def start(client, agent: str, thread_id: str, run_input: dict | None = None) -> str:
    created = client.post("/threads", json={"thread_id": thread_id, "agent": agent})
    assert created.status_code == 201, created.text
    started = client.post(f"/threads/{thread_id}/runs", json={"input": run_input or {}})
    assert started.status_code == 202, started.text
    return started.json()["run_id"]


def waited(client, thread_id: str, run_id: str, wait: str) -> tuple[dict, float]:
    """The answer to a waiting GET (200 asserted) and the seconds it took."""
    asked = time.monotonic()
    response = client.get(f"/threads/{thread_id}/runs/{run_id}", params={"wait": wait})
    took = time.monotonic() - asked
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    return response.json(), took


def test_answers_when_the_run_is_interrupted(client):
    run_id = start(client, "ask", "w-ask")
    body, took = waited(client, "w-ask", run_id, "20")
    assert body["run_id"] == run_id and body["status"] == "interrupted"
    assert body["ended_at"] is not None and took < 15
    # The same representation as a GET without `wait`.
    assert client.get(f"/threads/w-ask/runs/{run_id}").json() == body


def test_answers_when_the_run_succeeds(client):
    run_id = start(client, "echo", "w-echo", {"text": "hi"})
    body, took = waited(client, "w-echo", run_id, "20")
    assert (body["status"], body["error"]) == ("succeeded", None)
    assert body["started_at"] is not None and body["ended_at"] is not None
    assert took < 15
    # Answered from the columns its end carried: as the row gives them.
    assert client.get(f"/threads/w-echo/runs/{run_id}").json() == body


def test_answers_when_the_run_fails_with_its_error_read_audited(client):
    run_id = start(client, "incomplete", "w-fail")
    body, took = waited(client, "w-fail", run_id, "20")
    assert body["status"] == "failed" and took < 15
    assert "reason" in body["error"]  # the payload's missing fields, decrypted
    read = AuditEvent.objects.filter(
        kind="run.read", thread_id="w-fail", tenant=client.tenant
    )
    assert [event.data["run_ids"] for event in read] == [[run_id]]


def test_answers_the_current_state_when_the_wait_runs_out(client):
    run_id = start(client, "slow", "w-slow")  # five steps of 0.4 s
    body, took = waited(client, "w-slow", run_id, "0.5")
    assert body["status"] in ("queued", "running")
    assert 0.45 <= took < 3  # the run takes 2 s once claimed
    body, _ = waited(client, "w-slow", run_id, "20")
    assert body["status"] == "succeeded"


def test_a_run_that_already_stopped_answers_at_once(client):
    run_id = start(client, "echo", "w-done", {"text": "hi"})
    wait_for(
        lambda: Run.objects.get(pk=run_id).status == Run.Status.SUCCEEDED,
        what="the run to succeed",
    )
    body, took = waited(client, "w-done", run_id, "30")
    assert body["status"] == "succeeded" and took < 5  # not its 30 s


def test_a_cancelled_run_answers_at_once(client):
    run_id = start(client, "slow", "w-cancel")
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(waited, client, "w-cancel", run_id, "20")
        time.sleep(0.3)
        cancelled = client.post(
            f"{client.root}/langgraph/threads/w-cancel/runs/{run_id}/cancel"
        )
        assert cancelled.status_code == 202, cancelled.text
        body, took = answer.result()
    assert body["status"] == "cancelled" and took < 10


@pytest.mark.parametrize("how", ["wait", "join"])
def test_waiting_holds_no_database_connection(client, how):
    """Four waits at once (this GET's, or the Agent Protocol's join) on a web
    process with a pool of two connections; meanwhile other requests are
    answered at once."""
    thread_id = f"w-many-{how}"
    run_id = start(client, "slow", thread_id)

    def wait_once():
        if how == "wait":
            return waited(client, thread_id, run_id, "20")[0]["status"]
        joined = client.get(
            f"{client.root}/langgraph/threads/{thread_id}/runs/{run_id}/join"
        )
        assert joined.status_code == 200, joined.text
        return client.get(f"/threads/{thread_id}/runs/{run_id}").json()["status"]

    with ThreadPoolExecutor(4) as pool:
        waits = [pool.submit(wait_once) for _ in range(4)]
        time.sleep(0.5)
        asked = time.monotonic()
        for _ in range(3):
            assert client.get(f"/threads/{thread_id}").status_code == 200
        # A pool held by the waits would keep them DATABASE_POOL_TIMEOUT (10 s).
        assert time.monotonic() - asked < 5.0
        assert all(not w.done() for w in waits)
        assert [w.result() for w in waits] == ["succeeded"] * 4


# --- Refusals: answered before any wait, without a worker -------------------


@pytest.fixture
def queued_run(db):
    tenant, api = tenant_with_client()
    api.post("/api/v1/threads", {"thread_id": "q-1", "agent": "echo"}, format="json")
    api.post("/api/v1/threads", {"thread_id": "q-2", "agent": "echo"}, format="json")
    started = api.post(
        "/api/v1/threads/q-1/runs", {"input": {"text": "hi"}}, format="json"
    )
    return api, started.json()["run_id"]


@pytest.mark.parametrize(
    "value",
    [
        "-1",
        "31",
        "30.001",
        "1e3",
        "nan",
        "inf",
        "abc",
        "",
        " 1",
        "1\x00",
        "\x00",
        "1.2345",
        "\u0663",  # ARABIC-INDIC DIGIT THREE
        "9" * 400,
        "1,5",
    ],
)
def test_a_bad_wait_is_refused(queued_run, value):
    api, run_id = queued_run
    response = api.get(f"/api/v1/threads/q-1/runs/{run_id}", {"wait": value})
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["code"] == "invalid" and "wait" in body["fields"], body


@pytest.mark.parametrize("value", ["0", "0.0", "30", "2.5"])
def test_a_wait_of_0_to_30_seconds_is_taken(queued_run, value):
    api, run_id = queued_run
    if value not in ("0", "0.0"):
        # A queued run with no worker would be waited on: end it first.
        Run.objects.filter(pk=run_id).update(status=Run.Status.CANCELLED)
    response = api.get(f"/api/v1/threads/q-1/runs/{run_id}", {"wait": value})
    assert response.status_code == 200, response.content
    assert response.json()["run_id"] == run_id


def test_another_tenants_run_is_not_found_at_once(queued_run):
    _, run_id = queued_run
    _, other = tenant_with_client()
    asked = time.monotonic()
    response = other.get(f"/api/v1/threads/q-1/runs/{run_id}", {"wait": "30"})
    assert response.status_code == 404 and time.monotonic() - asked < 10


def test_a_run_of_another_thread_is_not_found_at_once(queued_run):
    api, run_id = queued_run
    asked = time.monotonic()
    response = api.get(f"/api/v1/threads/q-2/runs/{run_id}", {"wait": "30"})
    assert response.status_code == 404 and time.monotonic() - asked < 10


def test_scopes_are_those_of_the_runs_get(queued_run):
    api, run_id = queued_run
    tenant = Run.objects.get(pk=run_id).thread.tenant
    _, secret = make_api_key(tenant, ["approvals"])
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    response = api.get(f"/api/v1/threads/q-1/runs/{run_id}", {"wait": "30"})
    assert response.status_code == 403


# --- streaming.stopped, in-process, on either log ---------------------------


@pytest.fixture(params=["redis", "database"])
def published(request, queued_run, settings):
    """(run, publish): the queued run, and a function that publishes one of
    its events to the log the parameter names."""
    settings.GATEHOUSE_STREAM_URL = (
        settings.CELERY_BROKER_URL if request.param == "redis" else "database"
    )
    run = Run.objects.select_related("thread").get(pk=queued_run[1])
    publisher = streaming.Publisher(
        run_id=run.pk, attempt=1, cipher=ThreadCipher.for_thread(run.thread)
    )
    publisher.publish(streaming.METADATA, {"run_id": str(run.pk)})
    return run, publisher.publish


def timed_stop(run: Run, within: float) -> float:
    asked = time.monotonic()
    async_to_sync(streaming.stopped)(run.pk, within=within, idle=0.1)
    return time.monotonic() - asked


def test_stopped_waits_its_time_for_an_active_run(published):
    run, _ = published
    assert 0.5 <= timed_stop(run, 0.5) < 3


def test_stopped_returns_at_once_on_an_end_already_published(published):
    run, publish = published
    publish(streaming.END, streaming.outcome(status="succeeded"))
    assert timed_stop(run, 10) < 5


def test_stopped_returns_the_columns_an_end_carried(published):
    """Redis's log keeps an error-free end's copy of its run's columns for the
    waiting GET to answer from; the database log keeps none (its reader reads
    the row); a failed run's end carries none."""
    run, publish = published
    run.status = Run.Status.SUCCEEDED
    run.started_at = run.ended_at = timezone.now()
    ended = streaming.ended_columns(run)
    publish(streaming.END, streaming.outcome(status="succeeded"), ended)
    returned = async_to_sync(streaming.stopped)(run.pk, within=10, idle=0.1)
    if settings.GATEHOUSE_STREAM_URL == "database":
        assert returned is None
    else:
        assert returned == json.loads(ended)
        assert returned["ended_at"] == run.ended_at.isoformat()
    run.error = b"sealed"
    assert streaming.ended_columns(run) is None


def test_stopped_returns_on_a_run_stopped_without_its_end(published):
    """Its end lost (Redis down when it was published, say): the look-up
    after an idle pause finds it."""
    run, _ = published
    Run.objects.filter(pk=run.pk).update(status=Run.Status.SUCCEEDED)
    assert timed_stop(run, 10) < 5


def test_a_run_read_queued_and_never_claimed_is_read_from_the_logs_start(
    queued_run,
):
    """Its log held nothing when it was read so (runs.streaming.known_start):
    no look at the tail is needed; any other run's start is the tail's."""
    run = Run.objects.get(pk=queued_run[1])
    assert streaming.known_start(run) == streaming.START
    run.attempts = 1  # claimed once, then queued again: never done, but not assumed
    assert streaming.known_start(run) is None
    run.attempts, run.status = 0, Run.Status.RUNNING
    assert streaming.known_start(run) is None


def test_stopped_from_the_logs_start_finds_an_end_published_before_it_began(
    published,
):
    """A run read as queued that was claimed and ended before its wait began
    (its metadata and end published in between): read from the log's start,
    the end is found at once, with the columns it carried."""
    run, publish = published
    run.status = Run.Status.SUCCEEDED
    run.started_at = run.ended_at = timezone.now()
    ended = streaming.ended_columns(run)
    publish(streaming.END, streaming.outcome(status="succeeded"), ended)
    asked = time.monotonic()
    returned = async_to_sync(streaming.stopped)(
        run.pk, within=10, idle=5, after=streaming.START
    )
    assert time.monotonic() - asked < 3
    if settings.GATEHOUSE_STREAM_URL != "database":
        assert returned == json.loads(ended)


def test_stopped_wakes_on_the_end_as_it_is_published(queued_run, settings):
    settings.GATEHOUSE_STREAM_URL = settings.CELERY_BROKER_URL
    run = Run.objects.select_related("thread").get(pk=queued_run[1])
    publisher = streaming.Publisher(
        run_id=run.pk, attempt=1, cipher=ThreadCipher.for_thread(run.thread)
    )
    timer = threading.Timer(
        0.3, publisher.publish, (streaming.END, streaming.outcome(status="failed"))
    )
    # Timed from the timer's start: the wait may begin a little after it.
    started = time.monotonic()
    timer.start()
    timed_stop(run, 10)
    took = time.monotonic() - started
    timer.join()
    assert 0.3 <= took < 5


# --- A database outage during the wait: the run as read before it -------------


async def _read(response) -> bytes:
    return b"".join([part async for part in response.streaming_content])


@pytest.mark.parametrize("log", ["redis", "database"])
def test_an_outage_while_waiting_answers_the_run_read_before(
    transactional_db, settings, log
):
    """The 200 has gone out before the wait, so no 503 can follow: the body is
    the run as the view read it (queued), whole JSON, not a cut stream. On the
    database log the wait itself fails; on Redis the read after it."""
    settings.GATEHOUSE_STREAM_URL = (
        settings.CELERY_BROKER_URL if log == "redis" else "database"
    )
    _, api = tenant_with_client()
    api.post("/api/v1/threads", {"thread_id": "o-1", "agent": "echo"}, format="json")
    # Accepted with no message sent: no worker (this module's) takes it while
    # the test runs (the sweep waits for GATEHOUSE_RUN_LEASE_SECONDS).
    with broker_unreachable():
        started = api.post(
            "/api/v1/threads/o-1/runs", {"input": {"text": "hi"}}, format="json"
        )
    assert started.status_code == 202, started.content
    run_id = started.json()["run_id"]
    before = api.get(f"/api/v1/threads/o-1/runs/{run_id}").json()
    assert before["status"] == "queued"
    # The view answers at once; the wait runs as the body is read.
    response = api.get(f"/api/v1/threads/o-1/runs/{run_id}", {"wait": "1"})
    assert response.status_code == 200 and response.streaming
    with database_unreachable():
        body = json.loads(async_to_sync(_read)(response))
    assert body == before
    assert Run.objects.get(pk=run_id).status == Run.Status.QUEUED
