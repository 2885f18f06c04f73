"""Run stream events written to Redis without waiting for the replies
(runs.stream_sender): in order, a stale attempt stopped, an outage survived,
the unread replies bounded, a forked child on its own connection."""

import logging
import os
import socket
import threading
import time
import uuid

import pytest
import redis
from django.conf import settings

from runs import stream_sender, streaming
from runs.models import RunStreamEvent
from runs.streaming import Publisher, RedisLog
from tests.factories import tenant_with_client


class _Clear:
    """The cipher's interface without a thread: these tests are about the
    log, not the encryption (tests/runs/test_crypto covers that)."""

    def encrypt(self, data: bytes, *, row) -> bytes:
        return data


def _publisher(run_id, attempt: int = 1) -> Publisher:
    return Publisher(run_id=run_id, attempt=attempt, cipher=_Clear())


def _entries(run_id) -> list[tuple[str, str]]:
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    return [
        (entry_id.decode(), fields[b"e"].decode())
        for entry_id, fields in client.xrange(RedisLog.key(run_id))
    ]


@pytest.fixture
def redis_log(settings):
    settings.GATEHOUSE_STREAM_URL = settings.CELERY_BROKER_URL


def test_events_arrive_in_order_with_the_end_last(redis_log):
    """Two runs publishing from two threads at once: each run's events in its
    log in the order it published them, its end last."""
    runs = [uuid.uuid4(), uuid.uuid4()]

    def publish(run_id):
        publisher = _publisher(run_id)
        publisher.publish(streaming.METADATA, {"run_id": str(run_id)})
        for step in range(300):
            publisher.publish("updates", {"step": step})
        publisher.publish(streaming.END, streaming.outcome(status="succeeded"))

    threads = [threading.Thread(target=publish, args=(run,)) for run in runs]
    for each in threads:
        each.start()
    for each in threads:
        each.join()
    for run_id in runs:
        entries = _entries(run_id)
        assert [entry_id for entry_id, _ in entries] == [
            f"1-{seq}" for seq in range(302)
        ]
        assert entries[0][1] == streaming.METADATA
        assert entries[-1][1] == streaming.END
        ttl = redis.Redis.from_url(settings.CELERY_BROKER_URL).ttl(RedisLog.key(run_id))
        assert 0 < ttl <= settings.GATEHOUSE_STREAM_TTL_SECONDS


def test_a_stale_attempt_stops_publishing(redis_log, caplog):
    """A newer attempt owns the log: the older one's events are refused, it
    turns stale and publishes nothing more."""
    run_id = uuid.uuid4()
    newer, older = _publisher(run_id, attempt=2), _publisher(run_id, attempt=1)
    newer.publish(streaming.METADATA, {})
    with caplog.at_level(logging.WARNING, logger="runs.streaming"):
        older.publish("updates", {"step": 1})
        older.publish("updates", {"step": 2})
        streaming.flush()
    assert older.stale and not newer.stale
    assert "attempt 1 is stale" in caplog.text
    older.publish(streaming.END, streaming.outcome(status="succeeded"))
    newer.publish(streaming.END, streaming.outcome(status="succeeded"))
    assert _entries(run_id) == [("2-0", streaming.METADATA), ("2-1", streaming.END)]


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_redis_down_loses_the_events_not_the_run(settings, caplog):
    """The run's thread does not wait for Redis, nor fail: each event is
    logged lost; the run's outcome is in the database."""
    settings.GATEHOUSE_STREAM_URL = f"redis://127.0.0.1:{_closed_port()}/0"
    publisher = _publisher(uuid.uuid4())
    with caplog.at_level(logging.WARNING, logger="runs.streaming"):
        started = time.monotonic()
        publisher.publish(streaming.METADATA, {})
        publisher.publish(streaming.END, streaming.outcome(status="succeeded"))
        took = time.monotonic() - started
    assert took < 0.5
    assert "stream event metadata not published (ConnectionError)" in caplog.text
    assert "stream event end not published (ConnectionError)" in caplog.text
    assert not publisher.stale


def test_the_end_leaves_nothing_unanswered(redis_log):
    """Events before the end are written without waiting for their replies;
    the end reads them all."""
    run_id = uuid.uuid4()
    publisher = _publisher(run_id)
    publisher.publish(streaming.METADATA, {})
    publisher.publish("updates", {"step": 1})
    sender = streaming.log()._sender
    publisher.publish(streaming.END, streaming.outcome(status="succeeded"))
    assert not sender._pending
    assert [name for _, name in _entries(run_id)] == [
        streaming.METADATA,
        "updates",
        streaming.END,
    ]


def test_unread_replies_are_bounded(redis_log, monkeypatch):
    monkeypatch.setattr(stream_sender, "PENDING_LIMIT", 3)
    publisher = _publisher(uuid.uuid4())
    for step in range(20):
        publisher.publish("updates", {"step": step})
        assert len(streaming.log()._sender._pending) <= 3


def test_the_database_log_writes_in_the_runs_thread(db, settings):
    """The embedded mode's log has no sender: the row is there at once, in the
    run's own connection (and its transaction, for an end on commit)."""
    settings.GATEHOUSE_STREAM_URL = streaming.DATABASE
    _, api = tenant_with_client()
    api.post("/api/v1/threads", {"thread_id": "d-1", "agent": "echo"}, format="json")
    run_id = api.post(
        "/api/v1/threads/d-1/runs", {"input": {"text": "hi"}}, format="json"
    ).json()["run_id"]
    publisher = _publisher(run_id)
    publisher.publish(streaming.METADATA, {})
    assert list(
        RunStreamEvent.objects.filter(run_id=run_id).values_list(
            "attempt", "seq", "event"
        )
    ) == [(1, 0, streaming.METADATA)]


def test_a_forked_child_opens_a_connection_of_its_own(redis_log):
    """Celery's pool processes are forked: a child neither writes to its
    parent's socket nor reads its parent's replies."""
    parent = _publisher(uuid.uuid4())
    parent.publish(streaming.METADATA, {})  # its reply left unread
    sender = streaming.log()._sender
    inherited = sender._connection
    child_run = uuid.uuid4()
    pid = os.fork()
    if pid == 0:  # the child: exit code 0 if its events landed
        try:
            child = _publisher(child_run)
            child.publish(streaming.METADATA, {})
            child.publish(streaming.END, streaming.outcome(status="succeeded"))
            ok = sender._connection is not inherited and not sender._pending
            ok = ok and len(_entries(child_run)) == 2 and not child.stale
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    parent.publish(streaming.END, streaming.outcome(status="succeeded"))
    assert [name for _, name in _entries(parent.run_id)] == [
        streaming.METADATA,
        streaming.END,
    ]


def test_a_connection_the_server_closed_is_opened_again(redis_log):
    """Redis restarted or dropped the idle connection between two runs: the
    next run's events land all the same."""
    first = _publisher(uuid.uuid4())
    first.publish(streaming.END, streaming.outcome(status="succeeded"))
    connection = streaming.log()._sender._connection
    connection.send_command("CLIENT", "ID")
    client_id = connection.read_response()
    redis.Redis.from_url(settings.CELERY_BROKER_URL).client_kill_filter(_id=client_id)
    time.sleep(0.1)
    second = _publisher(uuid.uuid4())
    second.publish(streaming.METADATA, {})
    second.publish(streaming.END, streaming.outcome(status="succeeded"))
    assert [name for _, name in _entries(second.run_id)] == [
        streaming.METADATA,
        streaming.END,
    ]
