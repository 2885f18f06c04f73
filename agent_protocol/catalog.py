"""Assistants: every registered agent version, as LangGraph's API shows one.

An assistant's id is a UUID derived from "name@version" the way LangGraph
derives a graph's default assistant id from its name (uuid5 in LangGraph's
namespace), so it is the same in every process and across restarts. A client
may name an assistant by that id, by "name@version", or by the agent's name
alone (`graph_id`, what LangGraph clients usually send), which means the
version the thread is pinned to, or the newest for a new thread.
"""

from __future__ import annotations

import datetime
import importlib
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runs import registry

# LangGraph's namespace for assistant ids derived from graph ids.
NAMESPACE_GRAPH = uuid.UUID("6ba7b821-9dad-11d1-80b4-00c04fd430c8")


def assistant_id(spec: registry.AgentSpec) -> str:
    return str(uuid.uuid5(NAMESPACE_GRAPH, spec.key))


def _graph_default_id(name: str) -> str:
    return str(uuid.uuid5(NAMESPACE_GRAPH, name))


@dataclass(frozen=True)
class Resolved:
    """An assistant reference: the agent, and the version if one was named."""

    spec: registry.AgentSpec
    version: str | None

    @property
    def name(self) -> str:
        return self.spec.name


def resolve(reference: str) -> Resolved | None:
    """The assistant a client's `assistant_id` names, or None."""
    reference = str(reference or "").strip()
    specs = registry.agents()
    if reference in specs:
        return Resolved(specs[reference], specs[reference].version)
    for spec in specs.values():
        if reference == assistant_id(spec):
            return Resolved(spec, spec.version)
    names = {spec.name for spec in specs.values()}
    for name in names:
        if reference in (name, _graph_default_id(name)):
            return Resolved(registry.latest(name), None)
    return None


def _versions(name: str) -> list[registry.AgentSpec]:
    return sorted(
        (spec for spec in registry.agents().values() if spec.name == name),
        key=lambda spec: registry.version_sort_key(spec.version),
    )


def _deployed_at(spec: registry.AgentSpec) -> datetime.datetime:
    """When this version's code was deployed: its module file's time, which
    every process of a deployment agrees on."""
    module = importlib.import_module(spec.module)
    stamp = Path(module.__file__).stat().st_mtime if module.__file__ else 0
    return datetime.datetime.fromtimestamp(stamp, tz=datetime.UTC)


def assistant(spec: registry.AgentSpec) -> dict[str, Any]:
    deployed = _deployed_at(spec)
    return {
        "assistant_id": assistant_id(spec),
        "graph_id": spec.name,
        "name": spec.key,
        "description": spec.description or None,
        "config": {},
        "context": {},
        "metadata": {
            "created_by": "system",
            "agent_version": spec.version,
            "draining": spec.draining,
        },
        # LangGraph numbers an assistant's versions 1, 2, ...: the position of
        # this agent version among the agent's registered versions.
        "version": _versions(spec.name).index(spec) + 1,
        "created_at": deployed,
        "updated_at": deployed,
    }


def search(
    *,
    graph_id: str | None = None,
    name: str | None = None,
    metadata: dict | None = None,
) -> list[registry.AgentSpec]:
    """Registered agent versions, by name then version, filtered."""
    found = []
    for spec in sorted(
        registry.agents().values(),
        key=lambda spec: (spec.name, registry.version_sort_key(spec.version)),
    ):
        if graph_id and spec.name != graph_id:
            continue
        if name and name.lower() not in spec.key.lower():
            continue
        if metadata and any(
            assistant(spec)["metadata"].get(key) != value
            for key, value in metadata.items()
        ):
            continue
        found.append(spec)
    return found
