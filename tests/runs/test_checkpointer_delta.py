"""DeltaChannel threads on DjangoSaver: `get_delta_channel_history` in one query.

Each history is checked against LangGraph's own walk (`BaseCheckpointSaver`'s
default, one `get_tuple` per ancestor) over the same stored rows, and the
graphs' states against what the run produced.
"""

from typing import Annotated, TypedDict

import psycopg
import pytest
from langgraph.channels import DeltaChannel
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send

from runs.checkpointer import PACKED_WRITES_IDX, DjangoSaver
from runs.crypto import TamperedCiphertext, ThreadCipher
from runs.models import Checkpoint, PendingWrite, Thread
from tests.factories import make_tenant

SNAPSHOT_EVERY = 4


def _concat(state: list, writes: list) -> list:
    return [*state, *(item for write in writes for item in write)]


class Chat(TypedDict, total=False):
    log: Annotated[list, DeltaChannel(_concat, snapshot_frequency=SNAPSHOT_EVERY)]
    turns: int


def _speak(state: Chat) -> Chat:
    turn = state.get("turns", 0) + 1
    return {"log": [f"turn {turn}"], "turns": turn}


def chat_graph(saver):
    builder = StateGraph(Chat)
    builder.add_node("speak", _speak)
    builder.add_edge(START, "speak")
    builder.add_conditional_edges(
        "speak", lambda s: "speak" if s["turns"] % 5 else END, ["speak", END]
    )
    return builder.compile(checkpointer=saver)


class Fan(TypedDict, total=False):
    log: Annotated[list, DeltaChannel(_concat, snapshot_frequency=3)]


def _fan_out(state: Fan):
    return [Send("worker", {"log": [name]}) for name in ("a", "b", "c")]


def fan_graph(saver):
    builder = StateGraph(Fan)
    builder.add_node("worker", lambda s: {"log": [f"done {s['log'][-1]}"]})
    builder.add_conditional_edges(START, _fan_out, ["worker"])
    builder.add_edge("worker", END)
    return builder.compile(checkpointer=saver)


def _config(thread_id: str, checkpoint_id: str | None = None) -> dict:
    configurable = {"thread_id": thread_id, "checkpoint_ns": ""}
    if checkpoint_id:
        configurable["checkpoint_id"] = checkpoint_id
    return {"configurable": configurable, "recursion_limit": 200}


def _langgraphs_walk(saver, config, channels):
    return BaseCheckpointSaver.get_delta_channel_history(
        saver, config=config, channels=channels
    )


def _assert_same_histories(saver, thread_id: str, channels=("log",)) -> int:
    checked = 0
    for found in saver.list({"configurable": {"thread_id": thread_id}}):
        config = found.config
        assert saver.get_delta_channel_history(
            config=config, channels=list(channels)
        ) == _langgraphs_walk(saver, config, list(channels))
        checked += 1
    return checked


@pytest.mark.django_db(transaction=True)
def test_history_matches_langgraphs_walk_at_every_checkpoint():
    saver = DjangoSaver(tenant=make_tenant())
    graph = chat_graph(saver)
    for _ in range(3):
        graph.invoke({"log": ["user says hi"]}, _config("chat"))

    state = graph.get_state(_config("chat"))
    assert state.values["turns"] == 15
    assert state.values["log"][:2] == ["user says hi", "turn 1"]
    assert len(state.values["log"]) == 18
    assert Thread.objects.get(thread_id="chat").uses_delta_channels
    assert _assert_same_histories(saver, "chat") > 15
    # The latest checkpoint too, named by the thread alone.
    assert saver.get_delta_channel_history(
        config=_config("chat"), channels=["log", "turns"]
    ) == _langgraphs_walk(saver, _config("chat"), ["log", "turns"])


def _rewrite_as_before(saver, thread: Thread) -> None:
    """The thread's rows as versions before 2026-11-30 wrote them: a
    checkpoint and its metadata apart, a task's writes one row each."""
    cipher = ThreadCipher.for_thread(thread)
    for row in Checkpoint.objects.filter(thread=thread):
        ns, cid = row.checkpoint_ns, row.checkpoint_id
        body, metadata = cipher.decrypt_value(
            row.checkpoint, row=("checkpoint+metadata", ns, cid), serializer=saver.serde
        )
        row.checkpoint = cipher.encrypt_value(
            body, row=("checkpoint", ns, cid), serializer=saver.serde
        )
        row.metadata = cipher.encrypt_value(
            metadata, row=("metadata", ns, cid), serializer=saver.serde
        )
        row.save(update_fields=["checkpoint", "metadata"])
    for row in PendingWrite.objects.filter(thread=thread, idx__gte=PACKED_WRITES_IDX):
        ns, cid, task, path = (
            row.checkpoint_ns,
            row.checkpoint_id,
            row.task_id,
            row.task_path,
        )
        path, items = cipher.decrypt_value(
            row.value,
            row=("writes", ns, cid, task, row.idx, path),
            serializer=saver.serde,
        )
        for idx, channel, data in items:
            PendingWrite.objects.create(
                thread=thread,
                checkpoint_ns=ns,
                checkpoint_id=cid,
                task_id=task,
                task_path=path,
                idx=idx,
                channel=channel,
                value=cipher.encrypt_value(
                    saver.serde.loads(data),
                    row=("write", ns, cid, task, idx, channel, path),
                    serializer=saver.serde,
                ),
            )
        row.delete()


@pytest.mark.django_db(transaction=True)
def test_rows_written_before_packing_give_the_same_histories():
    saver = DjangoSaver(tenant=make_tenant())
    graph = chat_graph(saver)
    graph.invoke({"log": ["user says hi"]}, _config("chat"))
    thread = Thread.objects.get(thread_id="chat")
    assert PendingWrite.objects.filter(idx__gte=PACKED_WRITES_IDX).exists()
    before = saver.get_delta_channel_history(config=_config("chat"), channels=["log"])

    _rewrite_as_before(saver, thread)

    assert not PendingWrite.objects.filter(idx__gte=PACKED_WRITES_IDX).exists()
    assert not Checkpoint.objects.filter(metadata=b"").exists()
    fresh = DjangoSaver(tenant=thread.tenant)
    assert (
        fresh.get_delta_channel_history(config=_config("chat"), channels=["log"])
        == before
    )
    assert _assert_same_histories(fresh, "chat") > 5
    graph = chat_graph(fresh)
    graph.invoke({"log": ["and again"]}, _config("chat"))
    assert graph.get_state(_config("chat")).values["turns"] == 10
    assert _assert_same_histories(fresh, "chat") > 10


@pytest.mark.django_db(transaction=True)
def test_history_is_one_statement_whatever_the_walk(monkeypatch):
    saver = DjangoSaver(tenant=make_tenant())
    chat_graph(saver).invoke({"log": []}, _config("walk"))
    latest = saver.get_tuple(_config("walk"))
    statements = []

    class CountingCursor(psycopg.Cursor):
        def execute(self, query, *args, **kwargs):
            statements.append(query)
            return super().execute(query, *args, **kwargs)

    monkeypatch.setattr(psycopg, "Cursor", CountingCursor)
    history = saver.get_delta_channel_history(config=latest.config, channels=["log"])
    assert len(statements) == 1
    assert history["log"]["writes"][-1][2] == ["turn 5"]


@pytest.mark.django_db(transaction=True)
def test_parallel_writes_replay_in_task_order():
    saver = DjangoSaver(tenant=make_tenant())
    graph = fan_graph(saver)
    for _ in range(3):
        result = graph.invoke({"log": ["start"]}, _config("fan"))
    assert sorted(result["log"][-3:]) == ["done a", "done b", "done c"]
    assert graph.get_state(_config("fan")).values["log"] == result["log"]
    assert _assert_same_histories(saver, "fan") > 6


@pytest.mark.django_db(transaction=True)
def test_forks_and_updates_follow_the_parent_chain():
    saver = DjangoSaver(tenant=make_tenant())
    graph = chat_graph(saver)
    graph.invoke({"log": ["first"]}, _config("fork"))
    history = list(graph.get_state_history(_config("fork")))
    middle = next(s for s in history if s.values.get("turns") == 2)
    forked = graph.update_state(middle.config, {"log": ["edited"]})
    graph.invoke(None, forked)
    values = graph.get_state(_config("fork")).values
    assert values["log"][:4] == ["first", "turn 1", "turn 2", "edited"]
    assert "turn 5" not in values["log"][:4]
    assert _assert_same_histories(saver, "fork") > 10


@pytest.mark.django_db(transaction=True)
def test_a_value_stored_inline_before_the_channel_was_a_delta_channel_seeds_it():
    """A thread written when the channel was a plain string keeps it inline."""

    class Before(TypedDict, total=False):
        log: str

    class After(TypedDict, total=False):
        log: Annotated[list, DeltaChannel(_concat)]

    saver = DjangoSaver(tenant=make_tenant())
    old = StateGraph(Before)
    old.add_node("set", lambda s: {"log": "x"})
    old.add_edge(START, "set")
    old.compile(checkpointer=saver).invoke({"log": "a"}, _config("migrated"))

    new = StateGraph(After)
    new.add_node("add", lambda s: {"log": ["y"]})
    new.add_edge(START, "add")
    graph = new.compile(checkpointer=saver)
    graph.invoke({"log": ["z"]}, _config("migrated"))
    assert _assert_same_histories(saver, "migrated") > 3
    history = saver.get_delta_channel_history(
        config=_config("migrated"), channels=["log"]
    )
    assert history == _langgraphs_walk(saver, _config("migrated"), ["log"])


@pytest.mark.django_db(transaction=True)
def test_unknown_thread_or_checkpoint_has_an_empty_history():
    saver = DjangoSaver(tenant=make_tenant())
    assert saver.get_delta_channel_history(
        config=_config("nobody"), channels=["log"]
    ) == {"log": {"writes": []}}
    chat_graph(saver).invoke({"log": []}, _config("known"))
    other_tenant = DjangoSaver(tenant=make_tenant())
    assert other_tenant.get_delta_channel_history(
        config=_config("known"), channels=["log"]
    ) == {"log": {"writes": []}}


@pytest.mark.django_db(transaction=True)
def test_an_altered_blob_map_is_refused_not_followed():
    saver = DjangoSaver(tenant=make_tenant())
    chat_graph(saver).invoke({"log": ["x"]}, _config("tamper"))
    snapshot = (
        Checkpoint.objects.filter(thread__thread_id="tamper")
        .exclude(blob_versions={})
        .filter(blob_versions__has_key="log")
        .order_by("-checkpoint_id")
        .first()
    )
    assert snapshot is not None
    versions = dict(snapshot.blob_versions)
    versions["log"] = "00000000000000000000000000000001.0"
    Checkpoint.objects.filter(pk=snapshot.pk).update(blob_versions=versions)
    with pytest.raises(TamperedCiphertext):
        saver.get_delta_channel_history(config=_config("tamper"), channels=["log"])


@pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])
def test_sqlite_takes_langgraphs_walk():
    from runs.models import Tenant

    tenant = Tenant.objects.using("sqlite").create(slug="delta-sqlite", name="D")
    saver = DjangoSaver(tenant=tenant, using="sqlite")
    graph = chat_graph(saver)
    graph.invoke({"log": ["hi"]}, _config("lite"))
    assert len(graph.get_state(_config("lite")).values["log"]) == 6


@pytest.mark.django_db(transaction=True)
def test_snapshots_are_stored_compressed_harder():
    """A snapshot (the whole list, once per cadence) takes zstd's compact level;
    the store reads it as any other value."""
    import random

    from runs.models import ChannelBlob

    words = "refund order invoice customer shipping damaged status thanks".split()
    rng = random.Random(7)
    said = [" ".join(rng.choices(words, k=80)) for _ in range(60)]
    saver = DjangoSaver(tenant=make_tenant())
    state = chat_graph(saver).invoke({"log": said}, _config("chat"))
    thread = Thread.objects.get(thread_id="chat")
    cipher = ThreadCipher.for_thread(thread)
    snapshots = ChannelBlob.objects.filter(thread=thread, channel="log")
    assert snapshots.exists()
    for blob in snapshots:
        row = ("blob", "", "log", blob.version)
        value = cipher.decrypt_value(blob.value, row=row, serializer=saver.serde)
        usual = cipher.encrypt_value(value, row=row, serializer=saver.serde)
        assert len(blob.value) < len(usual)
    assert chat_graph(saver).get_state(_config("chat")).values == state
