"""Compiling a thread's agent with the Gatehouse saver, and version checks."""

from __future__ import annotations

import threading

from langgraph.pregel import Pregel

from runs import registry
from runs.checkpointer import DjangoSaver
from runs.errors import VersionSkew
from runs.models import Thread


def spec_for(thread: Thread, version: str | None = None) -> registry.AgentSpec:
    """The thread's pinned agent version, or VersionSkew when it is gone."""
    version = version or thread.agent_version
    try:
        return registry.get(thread.agent_name, version)
    except registry.UnknownAgent:
        raise VersionSkew(
            f"thread {thread.thread_id} is pinned to agent "
            f"{thread.agent_name}@{version}, which is no longer registered; "
            "register that version again to continue it, or fork the thread"
        ) from None


# Building and compiling a graph costs tens of milliseconds, more than the rest
# of a resume; a compiled graph is immutable, so each process compiles an agent
# version once and binds a copy to each run's tenant.
_compiled: dict[registry.AgentSpec, Pregel] = {}
_compiled_lock = threading.Lock()


def _template(spec: registry.AgentSpec, tenant) -> Pregel:
    with _compiled_lock:
        graph = _compiled.get(spec)
        if graph is None:
            graph = spec.compile(DjangoSaver(tenant=tenant))
            _compiled[spec] = graph
        return graph


def compiled(spec: registry.AgentSpec, tenant) -> Pregel:
    """The agent version's compiled graph, checkpointing for `tenant`."""
    template = _template(spec, tenant)
    return template.copy(
        update={"checkpointer": template.checkpointer.for_tenant(tenant)}
    )


def compile_for(thread: Thread, version: str | None = None) -> Pregel:
    return compiled(spec_for(thread, version), thread.tenant)


def thread_config(thread: Thread, checkpoint_id: str | None = None) -> dict:
    configurable = {"thread_id": thread.thread_id, "checkpoint_ns": ""}
    if checkpoint_id:
        configurable["checkpoint_id"] = checkpoint_id
    return {"configurable": configurable}


def ensure_nodes_exist(graph: Pregel, nodes: list[str], *, key: str) -> None:
    """Refuse to continue at a node the graph no longer has."""
    missing = [node for node in nodes if node not in graph.nodes]
    if missing:
        raise VersionSkew(
            f"the thread waits at node {missing[0]!r}, which agent {key} does not "
            "have; keep the version that has it registered, or fork the thread"
        )
