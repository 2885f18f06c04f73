"""runs.graph_executor: a run's LangGraph loop works on a pool kept from run to
run, as it would on one of its own: its end waits for everything it started,
nested loops get pools of their own, and a kept thread's connection is
checked at each run's start as a persistent connection is."""

from __future__ import annotations

import operator
import threading
import time
from typing import Annotated, TypedDict

import pytest
from django.db import connections
from langgraph.graph import END, START, StateGraph

from runs import graph_executor


class State(TypedDict):
    seen: Annotated[list, operator.add]


def _pool_of_this_thread() -> str:
    # ThreadPoolExecutor names its threads "<prefix>_<n>", a prefix per pool.
    return threading.current_thread().name.rsplit("_", 1)[0]


def _fan_out(*nodes) -> StateGraph:
    """START -> every node at once -> END: more than one task in a step, so
    LangGraph runs them on its executor's threads."""
    graph = StateGraph(State)
    for index, node in enumerate(nodes):
        graph.add_node(f"n{index}", node)
        graph.add_edge(START, f"n{index}")
        graph.add_edge(f"n{index}", END)
    return graph


def _pools(result: dict) -> set[str]:
    return {seen["pool"] for seen in result["seen"]}


def _note_pool(state: State) -> dict:
    return {"seen": [{"pool": _pool_of_this_thread()}]}


def test_runs_in_a_kept_pool_share_its_threads_and_others_do_not():
    graph = _fan_out(_note_pool, _note_pool).compile()
    kept = []
    for _ in range(3):
        with graph_executor.kept_pool():
            kept.append(_pools(graph.invoke({"seen": []})))
    fresh = [_pools(graph.invoke({"seen": []})) for _ in range(2)]
    assert len(set().union(*kept)) == 1
    assert not set().union(*kept) & set().union(*fresh)
    assert fresh[0] != fresh[1]


def test_the_loop_ends_when_all_it_started_has_finished():
    finished = []

    def slow(state: State) -> dict:
        time.sleep(0.3)
        finished.append(True)
        return {"seen": [{"pool": _pool_of_this_thread()}]}

    graph = _fan_out(slow, _note_pool).compile()
    with graph_executor.kept_pool():
        graph.invoke({"seen": []})
    assert finished == [True]


def test_a_nested_loop_gets_a_pool_of_its_own():
    inner = _fan_out(_note_pool, _note_pool).compile()

    def calls_inner(state: State) -> dict:
        # On a thread of the outer pool; the inner loop must not wait for one.
        return {
            "seen": [{"outer": _pool_of_this_thread(), **inner.invoke({"seen": []})}]
        }

    outer = _fan_out(calls_inner, calls_inner).compile()
    with graph_executor.kept_pool():
        result = outer.invoke({"seen": []})
    for seen in result["seen"]:
        assert _pools(seen) and seen["outer"] not in _pools(seen)


def test_a_config_with_its_own_concurrency_gets_its_own_pool():
    graph = _fan_out(_note_pool, _note_pool).compile()
    with graph_executor.kept_pool():
        kept = _pools(graph.invoke({"seen": []}))
    with graph_executor.kept_pool():
        own = _pools(graph.invoke({"seen": []}, {"max_concurrency": 2}))
    assert not kept & own


@pytest.mark.django_db(transaction=True)
def test_a_kept_threads_connection_is_checked_at_the_next_runs_start():
    def backend(state: State) -> dict:
        connection = connections["default"]
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            pid = cursor.fetchone()[0]
        # Past CONN_MAX_AGE from now on (checked at the next run's start).
        connection.close_at = time.monotonic() - 1
        return {"seen": [{"thread": threading.current_thread(), "pid": pid}]}

    graph = _fan_out(backend, backend).compile()
    with graph_executor.kept_pool():
        first = graph.invoke({"seen": []})["seen"]
    with graph_executor.kept_pool():
        second = graph.invoke({"seen": []})["seen"]
    before = {seen["thread"]: seen["pid"] for seen in first}
    again = [seen for seen in second if seen["thread"] in before]
    assert again, "the second run used none of the first run's threads"
    for seen in again:
        assert seen["pid"] != before[seen["thread"]]
