"""DjangoSaver: real graphs, what lands in the database, and what it refuses."""

import asyncio
import base64
import os
import shutil
import subprocess
import uuid
from datetime import datetime, timedelta
from typing import Annotated, TypedDict

import pytest
from asgiref.sync import sync_to_async
from django.core.management import call_command
from django.db import connection, connections
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.base.id import uuid6
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import Command, interrupt

from audit.models import AuditEvent
from runs import storage
from runs.checkpointer import PACKED_WRITES_IDX, DjangoSaver
from runs.crypto import (
    NotCiphertext,
    TamperedCiphertext,
    ThreadCipher,
    ThreadDeleted,
)
from runs.models import ChannelBlob, Checkpoint, PendingWrite, Thread
from runs.serde import DisallowedType
from tests.factories import make_tenant, stored_cipher

# --- a graph that asks a human -----------------------------------------------------


class ReviewState(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    approved: bool
    note: str


def _draft(state: ReviewState) -> ReviewState:
    request = state["messages"][-1].content
    return {"messages": [AIMessage(f"Draft reply to: {request}")]}


def _review(state: ReviewState) -> ReviewState:
    answer = interrupt(
        {"action": "send_reply", "preview": state["messages"][-1].content}
    )
    verdict = "Sent" if answer["approved"] else "Discarded"
    return {
        "approved": answer["approved"],
        "note": answer["note"],
        "messages": [AIMessage(f"{verdict}: {answer['note']}")],
    }


def review_graph(saver: DjangoSaver):
    graph = StateGraph(ReviewState)
    graph.add_node("draft", _draft)
    graph.add_node("review", _review)
    graph.add_edge(START, "draft")
    graph.add_edge("draft", "review")
    graph.add_edge("review", END)
    return graph.compile(checkpointer=saver)


def thread_config(thread_id: str, **metadata) -> dict:
    return {"configurable": {"thread_id": thread_id}, "metadata": metadata}


# --- put/get helpers ------------------------------------------------------------


def put_checkpoint(saver, thread_id, values, *, parent=None, new_versions=None, **md):
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = values
    checkpoint["channel_versions"] = {
        channel: saver.get_next_version(None, None) for channel in values
    }
    config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
    if parent:
        config["configurable"]["checkpoint_id"] = parent["configurable"][
            "checkpoint_id"
        ]
    versions = checkpoint["channel_versions"] if new_versions is None else new_versions
    metadata = {"source": "loop", "step": 0, **md}
    return saver.put(config, checkpoint, metadata, versions)


LONG = "x" * 2000  # a value too large to travel inside the checkpoint row


# --- end to end -------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_graph_interrupts_and_resumes_through_the_saver():
    saver = DjangoSaver(tenant=make_tenant())
    graph = review_graph(saver)
    config = thread_config("case-42")

    first = graph.invoke({"messages": [HumanMessage("Refund order 7")]}, config)

    assert first["__interrupt__"][0].value["action"] == "send_reply"
    state = graph.get_state(config)
    assert state.next == ("review",)
    assert state.interrupts[0].value["preview"] == "Draft reply to: Refund order 7"

    final = graph.invoke(Command(resume={"approved": True, "note": "ok"}), config)

    assert final["approved"] is True
    assert [m.content for m in final["messages"]] == [
        "Refund order 7",
        "Draft reply to: Refund order 7",
        "Sent: ok",
    ]
    assert graph.get_state(config).next == ()
    history = list(graph.get_state_history(config))
    assert len(history) == Checkpoint.objects.count() >= 4


@pytest.mark.django_db(transaction=True)
def test_graph_interrupts_and_resumes_through_the_async_saver():
    saver = DjangoSaver(tenant=make_tenant())
    graph = review_graph(saver)
    config = thread_config("case-43")

    async def run():
        try:
            await graph.ainvoke({"messages": [HumanMessage("Cancel plan")]}, config)
            paused = await graph.aget_state(config)
            final = await graph.ainvoke(
                Command(resume={"approved": False, "note": "no"}), config
            )
            return paused, final
        finally:
            # asgiref's worker thread outlives the test; so would its connection.
            await sync_to_async(connections.close_all)()

    paused, final = asyncio.run(run())

    assert paused.next == ("review",)
    assert final["messages"][-1].content == "Discarded: no"


def _pg_dump(database: str) -> str:
    settings = connection.settings_dict
    pg_dump = shutil.which("pg_dump") or "/usr/lib/postgresql/15/bin/pg_dump"
    command = [pg_dump, "--no-owner", "--dbname", database]
    for flag, key in (("--host", "HOST"), ("--port", "PORT"), ("--username", "USER")):
        if settings.get(key):
            command += [flag, str(settings[key])]
    env = {"PGPASSWORD": settings.get("PASSWORD") or ""}
    return subprocess.run(
        command, check=True, capture_output=True, text=True, env=env
    ).stdout


@pytest.mark.django_db(transaction=True)
def test_no_content_reaches_the_database_in_clear():
    """Input, messages, metadata, the interrupt and the resume value all carry
    a marker; a dump of the whole database holds it nowhere, not even as the
    hex of a bytea."""
    marker = f"marker-{uuid.uuid4().hex}"
    saver = DjangoSaver(tenant=make_tenant())
    graph = review_graph(saver)
    config = thread_config("case-dump", customer=marker)

    graph.invoke({"messages": [HumanMessage(f"Refund {marker}")]}, config)
    graph.invoke(Command(resume={"approved": True, "note": marker}), config)
    assert marker in graph.get_state(config).values["messages"][-1].content
    assert graph.get_state(config).metadata["customer"] == marker

    dump = _pg_dump(connection.settings_dict["NAME"])

    assert "case-dump" in dump  # the dump did dump the checkpoint store
    assert marker not in dump
    assert marker.encode().hex() not in dump
    assert base64.b64encode(marker.encode()).decode()[:40] not in dump


# --- tampering ----------------------------------------------------------------------


@pytest.mark.django_db
def test_ciphertext_copied_to_another_thread_fails():
    saver = DjangoSaver(tenant=make_tenant())
    put_checkpoint(saver, "a", {"text": LONG + "a"})
    put_checkpoint(saver, "b", {"text": LONG + "b"})
    stolen = ChannelBlob.objects.get(thread__thread_id="a").value
    ChannelBlob.objects.filter(thread__thread_id="b").update(value=stolen)

    with pytest.raises(TamperedCiphertext, match="failed authentication"):
        saver.get_tuple(thread_config("b"))


@pytest.mark.django_db
def test_ciphertext_copied_to_another_tenant_fails():
    ours, theirs = DjangoSaver(tenant=make_tenant()), DjangoSaver(tenant=make_tenant())
    put_checkpoint(ours, "case-1", {"text": "ours"})
    put_checkpoint(theirs, "case-1", {"text": "theirs"})
    stolen = Checkpoint.objects.get(thread__tenant=ours.tenant)
    Checkpoint.objects.filter(thread__tenant=theirs.tenant).update(
        checkpoint=stolen.checkpoint, metadata=stolen.metadata
    )

    with pytest.raises(TamperedCiphertext):
        theirs.get_tuple(thread_config("case-1"))


@pytest.mark.django_db
def test_ciphertext_moved_to_another_row_of_the_thread_fails():
    saver = DjangoSaver(tenant=make_tenant())
    first = put_checkpoint(saver, "a", {"text": LONG + "1"})
    second = put_checkpoint(saver, "a", {"text": LONG + "2"}, parent=first)
    # The first checkpoint's blob (blobs have no insertion-ordered id).
    first_versions = Checkpoint.objects.get(
        checkpoint_id=first["configurable"]["checkpoint_id"]
    ).blob_versions
    older = ChannelBlob.objects.get(version=first_versions["text"])
    ChannelBlob.objects.exclude(pk=older.pk).update(value=older.value)

    assert saver.get_tuple(first).checkpoint["channel_values"]["text"] == LONG + "1"
    with pytest.raises(TamperedCiphertext):
        saver.get_tuple(second)


@pytest.mark.django_db
def test_a_flipped_byte_fails():
    saver = DjangoSaver(tenant=make_tenant())
    stored = put_checkpoint(saver, "a", {"text": "hello"})
    saver.put_writes(stored, [("text", "pending")], "task-1")
    row = PendingWrite.objects.get()
    flipped = bytearray(row.value)
    flipped[20] ^= 0x40
    PendingWrite.objects.filter(pk=row.pk).update(value=bytes(flipped))

    with pytest.raises(TamperedCiphertext):
        saver.get_tuple(stored)


@pytest.mark.django_db
def test_a_plaintext_row_is_refused():
    saver = DjangoSaver(tenant=make_tenant())
    stored = put_checkpoint(saver, "a", {"text": LONG})
    typ, plain = saver.serde.dumps_typed("injected")
    ChannelBlob.objects.update(value=plain)

    with pytest.raises(NotCiphertext, match="refusing to read it as plaintext"):
        saver.get_tuple(stored)


@pytest.mark.django_db
def test_a_missing_blob_is_reported_not_skipped():
    saver = DjangoSaver(tenant=make_tenant())
    stored = put_checkpoint(saver, "a", {"text": LONG})
    ChannelBlob.objects.all().delete()

    with pytest.raises(TamperedCiphertext, match="missing"):
        saver.get_tuple(stored)


# --- storage shape ----------------------------------------------------------------


@pytest.mark.django_db
def test_small_values_are_inline_and_encrypted_large_ones_are_blobs():
    saver = DjangoSaver(tenant=make_tenant())
    stored = put_checkpoint(saver, "a", {"flag": True, "count": 3, "text": LONG})

    assert list(ChannelBlob.objects.values_list("channel", flat=True)) == ["text"]
    values = saver.get_tuple(stored).checkpoint["channel_values"]
    assert values == {"flag": True, "count": 3, "text": LONG}


@pytest.mark.django_db
def test_put_writes_only_channels_with_a_new_version():
    saver = DjangoSaver(tenant=make_tenant())
    first = put_checkpoint(saver, "a", {"history": [LONG], "notes": [LONG]})
    checkpoint = saver.get_tuple(first).checkpoint
    checkpoint["id"] = empty_checkpoint()["id"]
    new_version = saver.get_next_version(checkpoint["channel_versions"]["notes"], None)
    checkpoint["channel_versions"]["notes"] = new_version
    checkpoint["channel_values"]["notes"] = [LONG, LONG]
    second = saver.put(first, checkpoint, {"step": 1}, {"notes": new_version})

    assert ChannelBlob.objects.filter(channel="history").count() == 1
    assert ChannelBlob.objects.filter(channel="notes").count() == 2
    loaded = saver.get_tuple(second).checkpoint["channel_values"]
    assert loaded == {"history": [LONG], "notes": [LONG, LONG]}


@pytest.mark.django_db
def test_versions_count_up_and_never_repeat_across_threads_and_forks():
    from concurrent.futures import ThreadPoolExecutor

    saver = DjangoSaver(tenant=make_tenant())
    with ThreadPoolExecutor(4) as pool:
        versions = list(
            pool.map(lambda _: saver.get_next_version(41, None), range(2000))
        )
    assert len(set(versions)) == 2000
    assert {v.split(".")[0] for v in versions} == {f"{42:032}"}
    # PostgresSaver's form (and rows written before) counts on the same way.
    older = f"{7:032}.0.5488135039273248"
    assert saver.get_next_version(older, None).split(".")[0] == f"{8:032}"
    assert saver.get_next_version(older, None) > older
    first = saver.get_next_version(None, None)
    assert first < saver.get_next_version(first, None)

    def token(version: str) -> str:
        return version.split(".")[1][:16]

    # Another tenant's saver (or the same saver bound to it) shares nothing
    # that the versions stored in clear would show.
    other = DjangoSaver(tenant=make_tenant())
    assert token(other.get_next_version(41, None)) != token(versions[0])
    bound = saver.for_tenant(make_tenant())
    assert token(bound.get_next_version(41, None)) != token(versions[0])
    # A forked worker process draws a token of its own.
    read, write = os.pipe()
    child = os.fork()
    if child == 0:
        os.write(write, saver.get_next_version(41, None).encode())
        os._exit(0)
    os.waitpid(child, 0)
    assert token(os.read(read, 200).decode()) != token(versions[0])


class NotesState(TypedDict):
    notes: str
    step: int


@pytest.mark.django_db(transaction=True)
def test_forks_of_one_checkpoint_each_keep_their_own_blob():
    """Two state updates from one checkpoint give the blob channel the same
    counter; the tie-breaker keeps each fork's value its own."""
    saver = DjangoSaver(tenant=make_tenant())
    builder = StateGraph(NotesState)
    builder.add_node("write", lambda state: {"notes": LONG, "step": 1})
    builder.add_edge(START, "write")
    builder.add_edge("write", END)
    graph = builder.compile(checkpointer=saver)
    config = thread_config("forked")
    graph.invoke({"notes": "", "step": 0}, config)
    origin = graph.get_state(config).config

    forks = {
        text: graph.update_state(origin, {"notes": text})
        for text in ("a" * 2000, "b" * 2000)
    }

    for text, fork in forks.items():
        assert graph.get_state(fork).values["notes"] == text
    versions = [
        saver.get_tuple(fork).checkpoint["channel_versions"]["notes"]
        for fork in forks.values()
    ]
    assert versions[0].split(".")[0] == versions[1].split(".")[0]
    assert versions[0] != versions[1]
    assert ChannelBlob.objects.filter(channel="notes").count() == 3


@pytest.mark.django_db
def test_special_writes_are_overwritten_and_regular_ones_are_not():
    saver = DjangoSaver(tenant=make_tenant())
    stored = put_checkpoint(saver, "a", {})
    saver.put_writes(stored, [("answer", "first")], "task-1")
    saver.put_writes(stored, [("answer", "second")], "task-1")
    saver.put_writes(stored, [("__interrupt__", "first")], "task-1")
    saver.put_writes(stored, [("__interrupt__", "second")], "task-1")

    writes = saver.get_tuple(stored).pending_writes
    assert sorted(writes) == [
        ("task-1", "__interrupt__", "second"),
        ("task-1", "answer", "first"),
    ]


@pytest.mark.django_db
def test_pending_writes_come_back_in_langgraph_order():
    saver = DjangoSaver(tenant=make_tenant())
    stored = put_checkpoint(saver, "a", {})
    saver.put_writes(stored, [("c", 1), ("c", 2)], "task-b", task_path="~b")
    saver.put_writes(stored, [("c", 3)], "task-a", task_path="~b")
    saver.put_writes(stored, [("c", 4)], "task-z", task_path="~a")

    writes = saver.get_tuple(stored).pending_writes
    assert [value for _, _, value in writes] == [4, 3, 1, 2]


@pytest.mark.django_db
def test_a_tasks_writes_are_one_row_and_come_back_one_by_one():
    saver = DjangoSaver(tenant=make_tenant())
    stored = put_checkpoint(saver, "a", {})
    saver.put_writes(
        stored,
        [("messages", ["hi"]), ("branch:to:b", None), ("__error__", "oops")],
        "task-1",
    )
    # Repeated (a retried task): regular writes are kept from the first call.
    saver.put_writes(stored, [("messages", ["again"]), ("other", 1)], "task-1")
    saver.put_writes(stored, [("__error__", "later")], "task-1")

    rows = sorted(PendingWrite.objects.values_list("idx", "channel"))
    # The special write its own row (upserted), the two regular ones packed.
    assert rows == [(-1, "__error__"), (PACKED_WRITES_IDX, "")]
    assert b"hi" not in bytes(PendingWrite.objects.get(channel="").value)
    assert saver.get_tuple(stored).pending_writes == [
        ("task-1", "__error__", "later"),
        ("task-1", "messages", ["hi"]),
        ("task-1", "branch:to:b", None),
    ]

    saver.copy_thread("a", "b")
    assert saver.get_tuple(thread_config("b")).pending_writes == [
        ("task-1", "__error__", "later"),
        ("task-1", "messages", ["hi"]),
        ("task-1", "branch:to:b", None),
    ]


@pytest.mark.django_db
@pytest.mark.parametrize(
    "calls",
    [
        [[("x", 1), ("y", 2)], [("x", 3)]],
        [[("x", 1)], [("x", 3), ("y", 4)]],
        [[("x", 1)], [("x", 3)]],
    ],
    ids=["several-then-one", "one-then-several", "one-then-one"],
)
def test_a_tasks_repeated_writes_keep_the_first_as_langgraphs_savers_do(calls):
    """PostgresSaver and InMemorySaver insert a task's regular writes once per
    (task, idx): a later call does not replace an earlier one's."""
    from langgraph.checkpoint.memory import InMemorySaver

    results = []
    for saver in (DjangoSaver(tenant=make_tenant()), InMemorySaver()):
        stored = put_checkpoint(saver, "a", {})
        for writes in calls:
            saver.put_writes(stored, writes, "task-1")
        results.append(saver.get_tuple(stored).pending_writes)
    ours, theirs = results
    assert ours == theirs == [("task-1", "x", 1), *theirs[1:]]
    assert PendingWrite.objects.filter(idx__lt=PACKED_WRITES_IDX).count() == 0


@pytest.mark.django_db
def test_packed_writes_are_bound_to_their_row():
    saver = DjangoSaver(tenant=make_tenant())
    stored = put_checkpoint(saver, "a", {})
    saver.put_writes(stored, [("x", 1), ("y", 2)], "task-1")
    saver.put_writes(stored, [("x", 3), ("y", 4)], "task-2")
    one, two = PendingWrite.objects.order_by("task_id")
    PendingWrite.objects.filter(pk=two.pk).update(value=one.value)

    with pytest.raises(TamperedCiphertext):
        saver.get_tuple(stored)


@pytest.mark.django_db
def test_a_packed_row_keeps_its_task_path_inside_the_ciphertext():
    saver = DjangoSaver(tenant=make_tenant())
    stored = put_checkpoint(saver, "a", {})
    saver.put_writes(stored, [("c", 1)], "task-b", task_path="~b")
    saver.put_writes(stored, [("c", 2)], "task-a", task_path="~a")
    assert set(PendingWrite.objects.values_list("task_path", flat=True)) == {""}
    # Sorted by the path the ciphertext holds: ~a before ~b.
    assert saver.get_tuple(stored).pending_writes == [
        ("task-a", "c", 2),
        ("task-b", "c", 1),
    ]


@pytest.mark.django_db
def test_packed_rows_with_their_task_path_apart_still_read():
    """Rows written before 2026-12-01: the path in its column, the items alone."""
    saver = DjangoSaver(tenant=make_tenant())
    stored = put_checkpoint(saver, "a", {})
    thread = Thread.objects.get()
    cipher = stored_cipher(thread.pk)
    checkpoint_id = stored["configurable"]["checkpoint_id"]
    for task, path, value in (("task-b", "~a", 1), ("task-a", "~b", 2)):
        PendingWrite.objects.create(
            thread=thread,
            checkpoint_id=checkpoint_id,
            task_id=task,
            idx=PACKED_WRITES_IDX,
            channel="",
            task_path=path,
            value=cipher.encrypt_value(
                [[0, "c", saver.serde.dumps(value)]],
                row=("writes", "", checkpoint_id, task, PACKED_WRITES_IDX, path),
            ),
        )

    assert saver.get_tuple(stored).pending_writes == [
        ("task-b", "c", 1),
        ("task-a", "c", 2),
    ]


@pytest.mark.django_db
def test_writes_stored_one_row_each_still_read():
    """Rows written before writes were packed: one per write."""
    saver = DjangoSaver(tenant=make_tenant())
    stored = put_checkpoint(saver, "a", {})
    thread = Thread.objects.get()
    cipher = stored_cipher(thread.pk)
    checkpoint_id = stored["configurable"]["checkpoint_id"]
    for idx, (channel, value) in enumerate([("x", 1), ("y", 2)]):
        PendingWrite.objects.create(
            thread=thread,
            checkpoint_id=checkpoint_id,
            task_id="task-1",
            idx=idx,
            channel=channel,
            value=cipher.encrypt_value(
                value, row=("write", "", checkpoint_id, "task-1", idx, channel, "")
            ),
        )

    assert saver.get_tuple(stored).pending_writes == [
        ("task-1", "x", 1),
        ("task-1", "y", 2),
    ]


@pytest.mark.django_db
def test_a_checkpoint_and_its_metadata_are_one_ciphertext():
    saver = DjangoSaver(tenant=make_tenant())
    stored = put_checkpoint(saver, "a", {"text": "hello"}, note="a secret note")
    row = Checkpoint.objects.get()
    assert bytes(row.metadata) == b""
    assert b"secret" not in bytes(row.checkpoint)
    loaded = saver.get_tuple(stored)
    assert loaded.metadata["note"] == "a secret note"
    assert loaded.checkpoint["channel_values"] == {"text": "hello"}
    assert [t.metadata["note"] for t in saver.list(None, filter={"step": 0})] == [
        "a secret note"
    ]
    # Claiming the metadata is apart (or, below, packed) fails authentication.
    Checkpoint.objects.update(metadata=row.checkpoint)
    with pytest.raises(TamperedCiphertext):
        saver.get_tuple(stored)


@pytest.mark.django_db
def test_checkpoints_with_their_metadata_apart_still_read():
    """Rows written before a checkpoint and its metadata were one ciphertext."""
    saver = DjangoSaver(tenant=make_tenant())
    stored = put_checkpoint(saver, "a", {"text": "hello"})
    thread = Thread.objects.get()
    cipher = stored_cipher(thread.pk)
    checkpoint_id = stored["configurable"]["checkpoint_id"]
    body, metadata = cipher.decrypt_value(
        Checkpoint.objects.get().checkpoint,
        row=("checkpoint+metadata", "", checkpoint_id),
        serializer=saver.serde,
    )
    Checkpoint.objects.update(
        checkpoint=cipher.encrypt_value(
            body, row=("checkpoint", "", checkpoint_id), serializer=saver.serde
        ),
        metadata=cipher.encrypt_value(
            {**metadata, "note": "old"},
            row=("metadata", "", checkpoint_id),
            serializer=saver.serde,
        ),
    )

    assert saver.get_tuple(stored).metadata["note"] == "old"
    assert [t.metadata["note"] for t in saver.list(None, filter={"note": "old"})] == [
        "old"
    ]
    saver.copy_thread("a", "b")
    assert saver.get_tuple(thread_config("b")).metadata["note"] == "old"
    Checkpoint.objects.filter(thread=thread).update(metadata=b"")
    with pytest.raises(TamperedCiphertext):
        saver.get_tuple(stored)


@pytest.mark.django_db
def test_a_checkpoints_ts_is_stored_from_its_ids_time_and_reads_back():
    """LangGraph's stamp, taken just before its UUIDv6 id, is stored as the
    microseconds between them (runs.checkpoint_ts); any other is kept as is,
    and rows holding the text (written before) read as before."""
    saver = DjangoSaver(tenant=make_tenant())
    stored = put_checkpoint(saver, "a", {"text": "hello"})
    checkpoint_id = stored["configurable"]["checkpoint_id"]
    ts = saver.get_tuple(stored).checkpoint["ts"]
    assert datetime.fromisoformat(ts).utcoffset() == timedelta(0)
    cipher = stored_cipher(Thread.objects.get().pk)
    row = ("checkpoint+metadata", "", checkpoint_id)
    body, metadata = cipher.decrypt_value(
        Checkpoint.objects.get().checkpoint, row=row, serializer=saver.serde
    )
    assert type(body["ts"]) is int and abs(body["ts"]) < 1_000_000

    # Written before: the text itself.
    Checkpoint.objects.update(
        checkpoint=cipher.encrypt_value(
            [{**body, "ts": "2026-01-02T03:04:05Z"}, metadata],
            row=row,
            serializer=saver.serde,
        )
    )
    assert saver.get_tuple(stored).checkpoint["ts"] == "2026-01-02T03:04:05Z"
    # Stamps the form cannot give back exactly, and ids that are not UUIDv6.
    for stamp, checkpoint_id in (
        ("2026-01-02T03:04:05Z", str(uuid6())),
        ("2026-01-02T03:04:05.000001+01:00", str(uuid6())),
        ("2026-01-02T03:04:05.000001+00:00", str(uuid.uuid4())),
        ("2026-01-02T03:04:05.000001+00:00", "not-a-uuid"),
    ):
        checkpoint = {**empty_checkpoint(), "ts": stamp, "id": checkpoint_id}
        config = saver.put(thread_config("b"), checkpoint, {"step": 1}, {})
        assert saver.get_tuple(config).checkpoint["ts"] == stamp


@pytest.mark.django_db
def test_the_earlier_write_format_stores_a_checkpoints_ts_as_text(settings):
    """GATEHOUSE_WRITE_FORMAT=2026-12-01 (a rolling upgrade from the releases
    that read the text only): the stamp is stored as given, and reads back."""
    settings.GATEHOUSE_WRITE_FORMAT = "2026-12-01"
    saver = DjangoSaver(tenant=make_tenant())
    stored = put_checkpoint(saver, "a", {"text": "hello"})
    checkpoint_id = stored["configurable"]["checkpoint_id"]
    cipher = stored_cipher(Thread.objects.get().pk)
    body, _ = cipher.decrypt_value(
        Checkpoint.objects.get().checkpoint,
        row=("checkpoint+metadata", "", checkpoint_id),
        serializer=saver.serde,
    )
    assert isinstance(body["ts"], str)
    assert saver.get_tuple(stored).checkpoint["ts"] == body["ts"]


@pytest.mark.django_db
def test_list_filters_on_encrypted_metadata():
    saver = DjangoSaver(tenant=make_tenant())
    first = put_checkpoint(saver, "a", {}, customer={"tier": "gold", "id": 7})
    put_checkpoint(saver, "a", {}, parent=first, customer={"tier": "basic"})

    matches = list(
        saver.list(thread_config("a"), filter={"customer": {"tier": "gold"}})
    )

    assert [t.config for t in matches] == [first]
    assert Checkpoint.objects.filter(metadata__contains=b"gold").count() == 0


@pytest.mark.django_db
def test_the_saver_sees_only_its_tenant():
    ours, theirs = DjangoSaver(tenant=make_tenant()), DjangoSaver(tenant=make_tenant())
    put_checkpoint(ours, "case-1", {"who": "ours"})
    put_checkpoint(theirs, "case-1", {"who": "theirs"})
    put_checkpoint(theirs, "case-2", {"who": "theirs"})

    assert ours.get_tuple(thread_config("case-1")).checkpoint["channel_values"] == {
        "who": "ours"
    }
    assert ours.get_tuple(thread_config("case-2")) is None
    assert [t.config["configurable"]["thread_id"] for t in ours.list(None)] == [
        "case-1"
    ]
    assert Thread.objects.count() == 3


@pytest.mark.django_db
def test_a_type_outside_the_allow_list_is_refused_on_load():
    saver = DjangoSaver(tenant=make_tenant())
    stored = put_checkpoint(saver, "a", {"when": uuid.UUID(int=1), "odd": Odd(1)})

    with pytest.raises(DisallowedType, match="Odd"):
        saver.get_tuple(stored)
    allowing = DjangoSaver(tenant=saver.tenant, allowed_types=[Odd])
    assert allowing.get_tuple(stored).checkpoint["channel_values"]["odd"] == Odd(1)


class Odd(tuple):
    """A type no allow-list names."""

    def __new__(cls, value):
        return super().__new__(cls, (value,))

    def _asdict(self):
        return {"value": self[0]}


@pytest.mark.django_db
def test_copy_thread_re_encrypts_for_the_target():
    saver = DjangoSaver(tenant=make_tenant())
    stored = put_checkpoint(saver, "source", {"text": LONG})
    saver.put_writes(stored, [("text", "pending")], "task-1")

    saver.copy_thread("source", "target")

    copied = saver.get_tuple(thread_config("target"))
    assert copied.checkpoint["channel_values"] == {"text": LONG}
    assert copied.pending_writes == [("task-1", "text", "pending")]
    source_blob, target_blob = ChannelBlob.objects.order_by("thread_id")
    assert source_blob.value != target_blob.value


# --- deletion ----------------------------------------------------------------------


@pytest.mark.django_db
def test_shredding_makes_everything_unreadable_at_once():
    saver = DjangoSaver(tenant=make_tenant())
    stored = put_checkpoint(saver, "a", {"text": LONG})
    saver.put_writes(stored, [("text", "pending")], "task-1")
    thread = Thread.objects.get()

    storage.threads_shred(thread_pks=[thread.pk])

    assert Checkpoint.objects.count() == 1  # the rows are still there...
    with pytest.raises(ThreadDeleted, match="data key was destroyed"):
        stored_cipher(thread.pk)  # ...and nothing in them can be read
    assert saver.get_tuple(stored) is None  # the thread is a tombstone
    assert list(saver.list(None)) == []
    with pytest.raises(ThreadDeleted):
        saver.put_writes(stored, [("text", "late")], "task-2")


@pytest.mark.django_db
def test_delete_thread_leaves_a_tombstone_and_no_content():
    saver = DjangoSaver(tenant=make_tenant())
    stored = put_checkpoint(saver, "a", {"text": LONG})
    saver.put_writes(stored, [("text", "pending")], "task-1")

    saver.delete_thread("a")

    thread = Thread.objects.get()
    assert thread.deleted_at is not None and thread.wrapped_data_key is None
    assert Checkpoint.objects.count() == ChannelBlob.objects.count() == 0
    assert PendingWrite.objects.count() == 0
    assert saver.get_tuple(thread_config("a")) is None
    assert not Thread.objects.for_tenant(saver.tenant).exists()


@pytest.mark.django_db
def test_a_late_write_cannot_resurrect_a_deleted_thread():
    tenant = make_tenant()
    in_flight = DjangoSaver(tenant=tenant)
    stored = put_checkpoint(in_flight, "a", {"text": "hello"})

    DjangoSaver(tenant=tenant).delete_thread("a")

    with pytest.raises(ThreadDeleted, match="refusing a late write"):
        put_checkpoint(in_flight, "a", {"text": "late"}, parent=stored)
    with pytest.raises(ThreadDeleted):
        in_flight.put_writes(stored, [("text", "late")], "task-1")
    # A saver that never saw the thread is refused as well.
    with pytest.raises(ThreadDeleted):
        put_checkpoint(DjangoSaver(tenant=tenant), "a", {"text": "late"})
    assert Checkpoint.objects.count() == PendingWrite.objects.count() == 0
    assert Thread.objects.for_tenant(tenant).count() == 0


@pytest.mark.django_db
def test_a_late_write_does_not_land_in_a_new_thread_with_the_same_id():
    tenant = make_tenant()
    in_flight = DjangoSaver(tenant=tenant)
    stored = put_checkpoint(in_flight, "a", {"text": "old"})
    in_flight.delete_thread("a")
    Thread.objects.create_with_data_key(tenant=tenant, thread_id="a")

    with pytest.raises(ThreadDeleted):
        in_flight.put_writes(stored, [("text", "late")], "task-1")
    fresh = DjangoSaver(tenant=tenant)
    put_checkpoint(fresh, "a", {"text": "new"})
    assert fresh.get_tuple(thread_config("a")).checkpoint["channel_values"] == {
        "text": "new"
    }
    assert PendingWrite.objects.count() == 0


@pytest.mark.django_db
def test_a_late_write_cannot_recreate_a_thread_whose_row_is_gone():
    tenant = make_tenant()
    thread = Thread.objects.create_with_data_key(tenant=tenant, thread_id="a")
    in_flight = DjangoSaver(tenant=tenant)
    stored = put_checkpoint(in_flight, "a", {"text": "hello"})
    Thread.objects.filter(pk=thread.pk).delete()  # tombstone purged, rows gone

    with pytest.raises(ThreadDeleted):
        in_flight.put_writes(stored, [("text", "late")], "task-1")
    assert not Thread.objects.exists()


@pytest.mark.django_db
def test_an_adopted_thread_takes_its_first_write_in_one_statement():
    # The worker adopts the thread it claimed: the first write does not look
    # it up (no FOR KEY SHARE select of the thread, no transaction of its own).
    tenant = make_tenant()
    thread = Thread.objects.create_with_data_key(tenant=tenant, thread_id="a")
    saver = DjangoSaver(tenant=tenant)
    saver.adopt(thread, ThreadCipher.for_thread(thread))
    with CaptureQueriesContext(connection) as queries:
        stored = put_checkpoint(saver, "a", {"text": "hello"})
        saver.put_writes(stored, [("text", "more")], "task-1")
    # The guarded statements go through psycopg; the look-up through Django.
    assert [query["sql"] for query in queries] == []
    with CaptureQueriesContext(connection) as queries:
        put_checkpoint(DjangoSaver(tenant=tenant), "a", {"text": "again"})
    assert any("FOR KEY SHARE" in query["sql"] for query in queries)
    stored_tuple = DjangoSaver(tenant=tenant).get_tuple(stored)
    assert stored_tuple.checkpoint["channel_values"] == {"text": "hello"}
    assert stored_tuple.pending_writes == [("task-1", "text", "more")]


@pytest.mark.django_db
def test_a_thread_adopted_empty_answers_its_first_read_without_a_query():
    # The claim read that the thread has no checkpoint: the graph's first read
    # of its latest is None, asked of nobody; every later read is a query.
    # (Adopted empty over a stored checkpoint here, so that a None shows no
    # query was made.)
    tenant = make_tenant()
    thread = Thread.objects.create_with_data_key(tenant=tenant, thread_id="a")
    stored = put_checkpoint(DjangoSaver(tenant=tenant), "a", {"text": "hello"})
    saver = DjangoSaver(tenant=tenant)
    saver.adopt(thread, ThreadCipher.for_thread(thread), empty=True)
    assert saver.get_tuple(thread_config("a")) is None
    latest = saver.get_tuple(thread_config("a"))
    assert latest.checkpoint["channel_values"] == {"text": "hello"}
    # Only the latest of the root namespace: a named checkpoint, a subgraph's
    # namespace, or a read after the saver's own write is always a query.
    for config in (
        stored,
        {"configurable": {"thread_id": "a", "checkpoint_ns": "sub:1"}},
    ):
        saver.adopt(thread, ThreadCipher.for_thread(thread), empty=True)
        found = saver.get_tuple(config)
        assert (found is None) == (config is not stored)
        assert saver.get_tuple(thread_config("a")) is not None
    saver.adopt(thread, ThreadCipher.for_thread(thread), empty=True)
    put_checkpoint(saver, "a", {"text": "mine"}, parent=stored)
    assert saver.get_tuple(thread_config("a")).checkpoint["channel_values"] == {
        "text": "mine"
    }


class _Counted(TypedDict):
    count: int


def _add_one(state: _Counted) -> _Counted:
    return {"count": state["count"] + 1}


@pytest.mark.django_db(transaction=True)  # the subgraphs write from other threads
def test_an_adopted_thread_keeps_only_its_root_head_through_subgraph_calls():
    # Each call of a subgraph checkpoints under a namespace of its own
    # ("<node>:<task id>"): a head kept per namespace would pile up for the
    # whole run, while a worker only ever reads the root's (execution).
    tenant = make_tenant()
    thread = Thread.objects.create_with_data_key(tenant=tenant, thread_id="a")
    saver = DjangoSaver(tenant=tenant)
    saver.adopt(thread, ThreadCipher.for_thread(thread), empty=True)
    child = StateGraph(_Counted)
    child.add_node("add", _add_one)
    child.add_edge(START, "add")
    sub = child.compile(checkpointer=True)  # checkpoints in the parent's saver
    parent = StateGraph(_Counted)
    for node in ("first", "second", "third"):
        parent.add_node(node, sub)
    parent.add_edge(START, "first")
    parent.add_edge("first", "second")
    parent.add_edge("second", "third")
    graph = parent.compile(checkpointer=saver)

    config = thread_config("a")
    assert graph.invoke({"count": 0}, config)["count"] == 3
    stored = {
        ns for (ns,) in Checkpoint.objects.filter(thread=thread).values_list("checkpoint_ns")
    }
    assert len(stored - {""}) == 3  # the subgraphs did checkpoint, apart
    assert {ns for (_, ns) in saver._heads} == {""}
    head, _ = saver.head(thread.pk)
    assert head.checkpoint == saver.get_tuple(config).checkpoint


@pytest.mark.django_db
def test_an_adopted_thread_deleted_after_the_claim_refuses_late_writes():
    tenant = make_tenant()
    thread = Thread.objects.create_with_data_key(tenant=tenant, thread_id="a")
    in_flight = DjangoSaver(tenant=tenant)
    in_flight.adopt(thread, ThreadCipher.for_thread(thread))
    DjangoSaver(tenant=tenant).delete_thread("a")
    Thread.objects.create_with_data_key(tenant=tenant, thread_id="a")

    with pytest.raises(ThreadDeleted, match="refusing a late write"):
        put_checkpoint(in_flight, "a", {"text": "late"})
    with pytest.raises(ThreadDeleted):
        in_flight.put_writes(
            {"configurable": {"thread_id": "a", "checkpoint_id": "x"}},
            [("text", "late")],
            "task-1",
        )
    assert Checkpoint.objects.count() == PendingWrite.objects.count() == 0


@pytest.mark.django_db
def test_a_saver_adopts_no_thread_of_another_tenant():
    thread = Thread.objects.create_with_data_key(tenant=make_tenant(), thread_id="a")
    saver = DjangoSaver(tenant=make_tenant())
    with pytest.raises(ValueError, match="another tenant"):
        saver.adopt(thread, ThreadCipher.for_thread(thread))


@pytest.mark.django_db
def test_a_thread_under_legal_hold_cannot_be_deleted():
    saver = DjangoSaver(tenant=make_tenant())
    put_checkpoint(saver, "a", {"text": "kept"})
    Thread.objects.update(legal_hold=True)

    with pytest.raises(storage.ThreadUnderLegalHold):
        saver.delete_thread("a")
    assert saver.get_tuple(thread_config("a")) is not None


@pytest.mark.django_db
def test_keep_latest_keeps_only_the_blobs_the_latest_checkpoint_uses():
    saver = DjangoSaver(tenant=make_tenant())
    first = put_checkpoint(saver, "a", {"text": LONG + "1"})
    second = put_checkpoint(saver, "a", {"text": LONG + "2"}, parent=first)

    saver.prune(["a"], strategy="keep_latest")

    assert list(Checkpoint.objects.values_list("checkpoint_id", flat=True)) == [
        second["configurable"]["checkpoint_id"]
    ]
    assert ChannelBlob.objects.count() == 1
    latest = saver.get_tuple(thread_config("a"))
    assert latest.checkpoint["channel_values"] == {"text": LONG + "2"}
    assert latest.parent_config is None


# --- master key rotation ------------------------------------------------------------


def _key(key_id: str, fill: str) -> str:
    return f"{key_id}:{base64.b64encode(fill.encode() * 32).decode()}"


OLD, NEW = _key("old", "o"), _key("new", "n")


@pytest.mark.django_db
def test_after_rotation_and_removal_of_the_old_key_everything_decrypts(capsys):
    with override_settings(GATEHOUSE_MASTER_KEYS=OLD):
        saver = DjangoSaver(tenant=make_tenant())
        first = put_checkpoint(saver, "a", {"text": LONG, "n": 1})
        saver.put_writes(first, [("text", "pending")], "task-1")
        put_checkpoint(saver, "b", {"text": LONG + "b"})
        before = dict(ChannelBlob.objects.values_list("pk", "value"))

    with override_settings(GATEHOUSE_MASTER_KEYS=f"{NEW},{OLD}"):
        call_command("rotate_master_key", batch_size=1, verbosity=0)
        call_command("rotate_master_key", verbosity=0)  # a rerun finds nothing

    with override_settings(GATEHOUSE_MASTER_KEYS=NEW):
        loaded = saver.get_tuple(first)
        assert loaded.checkpoint["channel_values"] == {"text": LONG, "n": 1}
        assert loaded.pending_writes == [("task-1", "text", "pending")]
        assert saver.get_tuple(thread_config("b")) is not None
    assert set(Thread.objects.values_list("data_key_id", flat=True)) == {"new"}
    # Only the keys were rewrapped: no checkpoint was re-encrypted.
    assert dict(ChannelBlob.objects.values_list("pk", "value")) == before
    output = capsys.readouterr().out
    assert "rewrapped 2, already current 0, shredded 0" in output
    assert "rewrapped 0, already current 2, shredded 0" in output
    event = AuditEvent.objects.get(kind="crypto.master_key_rotated")
    assert event.data == {"key_id": "new", "rewrapped": 2}


@pytest.mark.django_db
def test_rotation_skips_shredded_threads_and_names_keys_missing_from_the_ring():
    from django.core.management.base import CommandError

    with override_settings(GATEHOUSE_MASTER_KEYS=OLD):
        saver = DjangoSaver(tenant=make_tenant())
        put_checkpoint(saver, "a", {"n": 1})
        put_checkpoint(saver, "b", {"n": 2})
        saver.delete_thread("b")

    with override_settings(GATEHOUSE_MASTER_KEYS=NEW):
        with pytest.raises(CommandError, match="old \\(1 threads\\)"):
            call_command("rotate_master_key", verbosity=0)
    assert Thread.objects.get(thread_id="a", deleted_at=None).data_key_id == "old"


# --- caller lists past a statement's parameter limit ---------------------------------

# More ids than one Postgres statement takes as parameters (65535).
MANY = 70_000


def _many_ids(*real: str) -> list[str]:
    return [*real, *(f"absent-{n}" for n in range(MANY))]


def _saver_on(db: str) -> DjangoSaver:
    if db == "default":
        return DjangoSaver(tenant=make_tenant())
    from runs.models import Tenant

    tenant = Tenant.objects.using(db).create(slug="many-ids", name="M")
    return DjangoSaver(tenant=tenant, using=db)


@pytest.mark.parametrize("db", ["default", "sqlite"])
@pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])
def test_delete_for_runs_and_prune_take_70000_ids(db):
    """LangGraph passes run and thread ids as one list with no cap: one `__in`
    of 70,000 ids failed on Postgres with server-side binding ("number of
    parameters must be between 0 and 65535"); the embedded mode (SQLite)
    takes the same call in its batches."""
    saver = _saver_on(db)
    checkpoints = Checkpoint.objects.using(db)
    first = put_checkpoint(saver, "a", {"text": LONG + "1"}, run_id="run-a")
    put_checkpoint(saver, "a", {"text": LONG + "2"}, parent=first, run_id="run-a")
    kept = put_checkpoint(saver, "b", {"text": "b1"}, run_id="run-b")
    latest = put_checkpoint(saver, "b", {"text": "b2"}, parent=kept, run_id="run-b")
    put_checkpoint(saver, "c", {"text": "c1"}, run_id="run-c")

    saver.delete_for_runs(_many_ids("run-a"))
    assert not checkpoints.filter(thread__thread_id="a").exists()
    assert checkpoints.filter(thread__thread_id="b").count() == 2

    saver.prune(_many_ids("b"), strategy="keep_latest")
    assert list(
        checkpoints.filter(thread__thread_id="b").values_list(
            "checkpoint_id", flat=True
        )
    ) == [latest["configurable"]["checkpoint_id"]]

    saver.prune(_many_ids("c"), strategy="delete")
    assert not checkpoints.filter(thread__thread_id="c").exists()
    assert checkpoints.filter(thread__thread_id="b").count() == 1
