"""The agent registry: name@version -> an agent.

An agent is a factory returning an uncompiled `StateGraph`, or a LangGraph
Functional API `@entrypoint` (a workflow of `@task`s); either way Gatehouse
attaches its own checkpointer (`AgentSpec.compile`), so agent code never
touches storage. Built-in agents come from settings.GATEHOUSE_BUILTIN_AGENTS;
operators add their own without editing code through GATEHOUSE_AGENTS, as
"name@version=package.module:factory,...". Factories are imported lazily, the
first time an agent is used or listed.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.pregel import Pregel

from runs.actions import GatedAction, declared_actions

_NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]*"
_KEY_RE = re.compile(rf"(?P<name>{_NAME})@(?P<version>{_NAME})")
_TARGET_RE = re.compile(r"(?P<module>[A-Za-z_][\w.]*):(?P<attr>[A-Za-z_]\w*)")


class UnknownAgent(LookupError):
    pass


@dataclass(frozen=True)
class AgentSpec:
    name: str
    version: str
    module: str
    attr: str
    draining: bool = False

    @property
    def key(self) -> str:
        return f"{self.name}@{self.version}"

    def factory(self) -> Callable | Pregel:
        """What the registration names: a graph factory or an `@entrypoint`."""
        try:
            module = importlib.import_module(self.module)
            return getattr(module, self.attr)
        except (ImportError, AttributeError) as exc:
            raise ImproperlyConfigured(
                f"agent {self.key}: cannot import {self.module}:{self.attr} ({exc})"
            ) from exc

    @property
    def is_functional(self) -> bool:
        """A Functional API `@entrypoint` rather than a StateGraph factory."""
        return isinstance(self.factory(), Pregel)

    @property
    def description(self) -> str:
        target = self.factory()
        if isinstance(target, Pregel):
            target = _entrypoint_function(target)
        doc = (target.__doc__ or "").strip()
        return doc.splitlines()[0] if doc else ""

    def _declared(self, name: str) -> frozenset[str]:
        return frozenset(getattr(self.factory(), name, ()))

    @property
    def safe_metadata_keys(self) -> frozenset[str]:
        """Thread metadata keys the agent declares safe to store in clear."""
        return self._declared("safe_metadata_keys")

    @property
    def safe_args(self) -> frozenset[str]:
        """Action arguments the agent declares safe to show in the audit trail."""
        return self._declared("safe_args")

    @property
    def patches(self) -> frozenset[str]:
        """The patches this version knows: both paths are in its code."""
        return self._declared("patches")

    @property
    def retired_patches(self) -> frozenset[str]:
        """Patches whose old path this version removed (runs.patches)."""
        return self._declared("retired_patches")

    @property
    def actions(self) -> dict[str, GatedAction] | None:
        """The gated actions the agent declares (runs.actions), by name; None
        when it declares nothing."""
        return declared_actions(self.factory())

    def action(self, name: str) -> GatedAction | None:
        return (self.actions or {}).get(name)

    @property
    def gated_nodes(self) -> frozenset[str] | None:
        """The nodes that ask for a decision, as declared; None when unknown."""
        actions = self.actions
        if actions is None:
            return None
        return frozenset(
            action.node for action in actions.values() if action.node is not None
        )

    def build_graph(self):
        """A new uncompiled StateGraph of this agent version."""
        return self.factory()()

    def compile(self, checkpointer: BaseCheckpointSaver) -> Pregel:
        """The agent, ready to run, checkpointing through `checkpointer`."""
        target = self.factory()
        graph = target if isinstance(target, Pregel) else target()
        if not isinstance(graph, Pregel):
            return graph.compile(checkpointer=checkpointer)
        # An @entrypoint is already a Pregel: bind it to the saver, keeping the
        # serialisation allow-list LangGraph derived from its signature.
        allowlist = getattr(graph, "_serde_allowlist", None)
        if allowlist is not None:
            checkpointer = checkpointer.with_allowlist(allowlist)
        return graph.copy(update={"checkpointer": checkpointer})


def _entrypoint_function(graph: Pregel) -> Callable:
    """The function an `@entrypoint` wraps (its one node's callable)."""
    node = next(iter(graph.nodes.values()))
    return getattr(node.bound, "func", None) or node.bound


def _parse(key: str, target: str, *, draining: set[str], source: str) -> AgentSpec:
    key_match = _KEY_RE.fullmatch(key.strip())
    target_match = _TARGET_RE.fullmatch(target.strip())
    if not key_match or not target_match:
        raise ImproperlyConfigured(
            f"{source}: {key}={target!r} is not name@version=package.module:factory"
        )
    return AgentSpec(
        name=key_match["name"],
        version=key_match["version"],
        module=target_match["module"],
        attr=target_match["attr"],
        draining=key.strip() in draining,
    )


@lru_cache(maxsize=1)
def agents() -> dict[str, AgentSpec]:
    """Every registered agent version, by "name@version"."""
    draining = {item.strip() for item in settings.GATEHOUSE_DRAINING_AGENTS}
    specs: dict[str, AgentSpec] = {}
    for key, target in settings.GATEHOUSE_BUILTIN_AGENTS.items():
        spec = _parse(key, target, draining=draining, source="GATEHOUSE_BUILTIN_AGENTS")
        specs[spec.key] = spec
    for entry in filter(
        None, (e.strip() for e in settings.GATEHOUSE_AGENTS.split(","))
    ):
        key, sep, target = entry.partition("=")
        if not sep:
            raise ImproperlyConfigured(
                f"GATEHOUSE_AGENTS: {entry!r} is not name@version=package.module:factory"
            )
        spec = _parse(key, target, draining=draining, source="GATEHOUSE_AGENTS")
        specs[spec.key] = spec
    unknown_draining = draining - specs.keys()
    if unknown_draining:
        raise ImproperlyConfigured(
            f"GATEHOUSE_DRAINING_AGENTS names unregistered {sorted(unknown_draining)}"
        )
    return specs


def get(name: str, version: str) -> AgentSpec:
    try:
        return agents()[f"{name}@{version}"]
    except KeyError:
        raise UnknownAgent(f"agent {name}@{version} is not registered") from None


def latest(name: str, *, for_new_threads: bool = False) -> AgentSpec:
    """The newest registered version of an agent (optionally: not draining)."""
    candidates = [
        spec
        for spec in agents().values()
        if spec.name == name and not (for_new_threads and spec.draining)
    ]
    if not candidates:
        raise UnknownAgent(
            f"no {'non-draining ' if for_new_threads else ''}"
            f"version of agent {name!r} is registered"
        )
    return max(candidates, key=lambda spec: version_sort_key(spec.version))


def version_sort_key(version: str) -> tuple:
    return tuple(
        (0, int(part)) if part.isdigit() else (1, part)
        for part in re.split(r"[.-]", version)
    )
