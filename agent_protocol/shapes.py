"""Gatehouse's threads, runs and states in the shapes of the pinned
langgraph-sdk (langgraph_sdk.schema): what the API answers."""

from __future__ import annotations

import uuid
from typing import Any

from agent_protocol.catalog import NAMESPACE_GRAPH
from runs import registry
from runs.models import Run, Thread
from runs.selectors import jsonable

THREAD_STATUS = {
    Thread.Status.IDLE: "idle",
    Thread.Status.RUNNING: "busy",
    Thread.Status.INTERRUPTED: "interrupted",
    Thread.Status.ERROR: "error",
}
THREAD_STATUS_FROM_SDK = {sdk: ours for ours, sdk in THREAD_STATUS.items()}

# A run that stopped on interrupt() and a cancelled one are both what LangGraph
# calls "interrupted"; the thread's status tells which (interrupted or not).
RUN_STATUS = {
    Run.Status.QUEUED: "pending",
    Run.Status.RUNNING: "running",
    Run.Status.INTERRUPTED: "interrupted",
    Run.Status.SUCCEEDED: "success",
    Run.Status.FAILED: "error",
    Run.Status.CANCELLED: "interrupted",
}
RUN_STATUS_FROM_SDK = {
    "pending": [Run.Status.QUEUED],
    "running": [Run.Status.RUNNING],
    "interrupted": [Run.Status.INTERRUPTED, Run.Status.CANCELLED],
    "success": [Run.Status.SUCCEEDED],
    "error": [Run.Status.FAILED],
    "timeout": [],
}


def assistant_id_of(agent_name: str, version: str) -> str:
    return str(uuid.uuid5(NAMESPACE_GRAPH, f"{agent_name}@{version}"))


def thread_assistant_id(thread: Thread) -> str | None:
    """The assistant of the thread's pinned version, or of the version its
    next run would be pinned to."""
    if not thread.agent_name:
        return None
    version = thread.agent_version
    if not version:
        try:
            version = registry.latest(thread.agent_name).version
        except registry.UnknownAgent:
            return None
    return assistant_id_of(thread.agent_name, version)


def thread_metadata(thread: Thread) -> dict[str, Any]:
    metadata = dict(thread.metadata)
    if thread.agent_name:
        metadata["graph_id"] = thread.agent_name
        metadata["assistant_id"] = thread_assistant_id(thread)
    return metadata


def checkpoint(thread: Thread, config: dict | None) -> dict | None:
    configurable = (config or {}).get("configurable") or {}
    if not configurable.get("checkpoint_id"):
        return None
    return {
        "thread_id": thread.thread_id,
        "checkpoint_ns": configurable.get("checkpoint_ns", ""),
        "checkpoint_id": configurable["checkpoint_id"],
        "checkpoint_map": configurable.get("checkpoint_map"),
    }


def _task(thread: Thread, task) -> dict[str, Any]:
    state = task.state
    return {
        "id": task.id,
        "name": task.name,
        "error": None if task.error is None else repr(task.error),
        "interrupts": jsonable(list(task.interrupts)),
        "checkpoint": checkpoint(thread, state) if isinstance(state, dict) else None,
        "state": state_of(thread, state) if hasattr(state, "values") else None,
        "result": jsonable(task.result) if task.result is not None else None,
    }


def state_of(thread: Thread, snapshot) -> dict[str, Any]:
    """A LangGraph StateSnapshot as the SDK's ThreadState."""
    metadata = dict(snapshot.metadata or {})
    return {
        "values": jsonable(snapshot.values),
        "next": list(snapshot.next),
        "tasks": [_task(thread, task) for task in snapshot.tasks],
        "checkpoint": checkpoint(thread, snapshot.config),
        "metadata": jsonable(metadata),
        "created_at": snapshot.created_at,
        "parent_checkpoint": checkpoint(thread, snapshot.parent_config),
        "interrupts": jsonable(list(snapshot.interrupts)),
    }


def empty_state(thread: Thread) -> dict[str, Any]:
    """The state of a thread with no checkpoint yet, as LangGraph shows it."""
    return {
        "values": {},
        "next": [],
        "tasks": [],
        "checkpoint": None,
        "metadata": {},
        "created_at": None,
        "parent_checkpoint": None,
        "interrupts": [],
    }


def thread_of(thread: Thread, snapshot=None) -> dict[str, Any]:
    """A thread as the SDK's Thread; `snapshot` is its latest state, if read."""
    interrupts: dict[str, list] = {}
    values = None
    if snapshot is not None and snapshot.created_at is not None:
        values = jsonable(snapshot.values)
        for task in snapshot.tasks:
            if task.interrupts:
                interrupts[task.id] = jsonable(list(task.interrupts))
    return {
        "thread_id": thread.thread_id,
        "created_at": thread.created_at,
        "updated_at": thread.updated_at,
        "state_updated_at": thread.updated_at,
        "metadata": thread_metadata(thread),
        "status": THREAD_STATUS[thread.status],
        "config": {},
        "values": values,
        "interrupts": interrupts,
    }


def run_of(run: Run, thread: Thread) -> dict[str, Any]:
    return {
        "run_id": str(run.id),
        "thread_id": thread.thread_id,
        "assistant_id": assistant_id_of(thread.agent_name, run.agent_version),
        "created_at": run.created_at,
        "updated_at": run.ended_at or run.started_at or run.created_at,
        "status": RUN_STATUS[run.status],
        "metadata": run.metadata,
        "multitask_strategy": run.multitask_strategy,
    }


def wait_output(outcome: dict) -> dict[str, Any] | None:
    """What `runs.wait` and `runs.join` answer for a run's `end` outcome:
    the thread's values, with the interrupts it stopped on, or its error."""
    if outcome.get("error"):
        return {"__error__": outcome["error"]}
    values = outcome.get("values")
    if outcome.get("interrupts"):
        return {**(values or {}), "__interrupt__": outcome["interrupts"]}
    return values
