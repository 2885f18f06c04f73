"""Compiling a thread's agent with the Gatehouse saver, and version checks."""

from __future__ import annotations

import threading

from langgraph.pregel import Pregel

from runs import registry
from runs.checkpointer import DjangoSaver
from runs.errors import InvalidRequest, VersionSkew
from runs.models import Thread
from runs.models.checkpoints import compact_id


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
        update={
            "checkpointer": template.checkpointer.for_tenant(tenant),
            # The template was validated when it was compiled, and the copy
            # changes its saver only, which validation does not look at:
            # validating again was most of the copy's CPU, on every run.
            "auto_validate": False,
        }
    )


def compile_for(thread: Thread, version: str | None = None) -> Pregel:
    return compiled(spec_for(thread, version), thread.tenant)


# The longest checkpoint id a client may name: longer than any LangGraph makes
# (a UUID, 36 characters), and what the columns held before 0019 (varchar(255)).
MAX_ID_LENGTH = 255


def thread_config(
    thread: Thread, checkpoint_id: str | None = None, *, field: str = "checkpoint_id"
) -> dict:
    """The config that addresses the thread, or one of its checkpoints.

    Every checkpoint id a client names (a URL, `before`, a body) reaches the
    saver through here, so this is where one no checkpoint can have (a NUL or
    a lone surrogate, which `compact_id` cannot store, too long, not text) is
    refused: 400 naming `field`, which the state views answer as 404, as any
    unknown checkpoint. Not a 500 from the saver's lookup."""
    configurable = {"thread_id": thread.thread_id, "checkpoint_ns": ""}
    if checkpoint_id:
        if not _storable_id(checkpoint_id):
            raise InvalidRequest(
                f"thread {thread.thread_id} has no checkpoint {checkpoint_id!r}",
                field=field,
            )
        configurable["checkpoint_id"] = checkpoint_id
    return {"configurable": configurable}


def _storable_id(value) -> bool:
    if not isinstance(value, str) or len(value) > MAX_ID_LENGTH:
        return False
    try:
        compact_id(value)
    except ValueError:  # a NUL, or UnicodeEncodeError (a lone surrogate)
        return False
    return True


def ensure_nodes_exist(graph: Pregel, nodes: list[str], *, key: str) -> None:
    """Refuse to continue at a node the graph no longer has."""
    missing = [node for node in nodes if node not in graph.nodes]
    if missing:
        raise VersionSkew(
            f"the thread waits at node {missing[0]!r}, which agent {key} does not "
            "have; keep the version that has it registered, or fork the thread"
        )
