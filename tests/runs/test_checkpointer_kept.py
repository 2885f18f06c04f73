"""A run reads its thread's latest checkpoint back from what its own writes
stored (DjangoSaver.adopt): the same tuple as the database gives, and the
database again whenever that is not known."""

import copy

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from runs.checkpointer import DjangoSaver
from runs.crypto import ThreadCipher
from runs.models import Thread
from tests.factories import make_tenant
from tests.runs.test_checkpointer import LONG, put_checkpoint, thread_config

# Outside a test transaction: only committed writes are kept.
pytestmark = pytest.mark.django_db(transaction=True)


def _adopted(thread_id: str = "a") -> tuple[DjangoSaver, Thread]:
    tenant = make_tenant()
    thread = Thread.objects.create_with_data_key(tenant=tenant, thread_id=thread_id)
    saver = DjangoSaver(tenant=tenant)
    saver.adopt(thread, ThreadCipher.for_thread(thread))
    return saver, thread


def _from_database(saver: DjangoSaver, config: dict):
    fresh = copy.copy(saver)
    fresh._kept = {}
    return fresh.get_tuple(config)


def _statements(saver: DjangoSaver, config: dict) -> int:
    """How many statements get_tuple sends (psycopg's, counted at the source)."""
    sent = []
    query = saver._query
    saver._query = lambda statements: sent.extend(statements) or query(statements)
    try:
        saver.get_tuple(config)
    finally:
        del saver._query
    return len(sent)


def test_the_latest_checkpoint_with_its_writes_is_read_as_stored():
    saver, _ = _adopted()
    first = put_checkpoint(saver, "a", {"text": LONG + "1", "n": 1})
    latest = put_checkpoint(saver, "a", {"text": LONG + "2", "n": 2}, parent=first)
    saver.put_writes(latest, [("text", "more"), ("n", 3)], "task-1", "path")
    saver.put_writes(latest, [("__interrupt__", "ask")], "task-2")
    saver.put_writes(latest, [("__interrupt__", "asked")], "task-2")  # upserted

    kept = saver.get_tuple(thread_config("a"))
    assert kept == _from_database(saver, thread_config("a"))
    assert kept.checkpoint["channel_values"] == {"text": LONG + "2", "n": 2}
    assert ("task-2", "__interrupt__", "asked") in kept.pending_writes
    assert _statements(saver, thread_config("a")) == 0
    # A checkpoint named by its id is read from the database.
    assert _statements(saver, latest) == 1


def test_nothing_is_kept_inside_a_transaction_or_once_released():
    saver, thread = _adopted()
    put_checkpoint(saver, "a", {"text": LONG})
    assert _statements(saver, thread_config("a")) == 0
    saver.release(thread)
    assert _statements(saver, thread_config("a")) == 1

    saver.adopt(thread, ThreadCipher.for_thread(thread))  # a new run
    assert _statements(saver, thread_config("a")) == 1  # an earlier run's
    from django.db import transaction

    with transaction.atomic():
        put_checkpoint(saver, "a", {"text": LONG + "2"})
    assert _statements(saver, thread_config("a")) == 1


def test_writes_whose_stored_rows_are_not_known_send_the_read_to_the_database():
    saver, _ = _adopted()
    stored = put_checkpoint(saver, "a", {"text": "x"})
    saver.put_writes(stored, [("text", "one"), ("text", "two")], "task-1")
    # The same task's packed row again, with more writes: merged in a
    # transaction (which rows it keeps is the database's to say).
    saver.put_writes(stored, [("text", "1"), ("text", "2"), ("text", "3")], "task-1")
    assert _statements(saver, thread_config("a")) == 1
    assert saver.get_tuple(thread_config("a")) == _from_database(
        saver, thread_config("a")
    )


def test_a_deletion_forgets_what_was_kept():
    saver, _ = _adopted()
    put_checkpoint(saver, "a", {"text": LONG})
    saver.delete_thread("a")
    with CaptureQueriesContext(connection):
        assert saver.get_tuple(thread_config("a")) is None
