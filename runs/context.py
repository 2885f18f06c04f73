"""What a graph's nodes know about the Gatehouse run executing them.

Passed as LangGraph's runtime context (`graph.invoke(..., context=...)`),
which is never persisted; nodes and the durable helpers (`runs.tools`,
`runs.replay`, `runs.patches`) read it with `current_step()`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from langgraph.runtime import ExecutionInfo, get_runtime

from runs.models import Thread


@dataclass(frozen=True)
class RunContext:
    tenant_id: int
    thread_pk: int
    run_id: str
    # The patches the thread started with; those its agent version knows, and
    # those it retired (runs.patches).
    patches: frozenset[str] = field(default_factory=frozenset)
    known_patches: frozenset[str] = field(default_factory=frozenset)
    retired_patches: frozenset[str] = field(default_factory=frozenset)
    # Thread.step_aliases: steps that a checkpoint migration moved.
    step_aliases: Mapping[str, Sequence[str]] = field(default_factory=dict)
    # The thread's row (with its tenant) as the worker claimed the run: what
    # runs.tools records under, without reading it again for every call.
    # Read-only: nodes may run in threads of their own.
    thread: Thread | None = field(default=None, compare=False, repr=False)

    def thread_row(self) -> Thread:
        """The thread's row with its tenant: the claimed one, or read if the
        context was built without it."""
        if self.thread is not None:
            return self.thread
        return Thread.objects.select_related("tenant").get(pk=self.thread_pk)


class OutsideRun(RuntimeError):
    """A durable helper was called outside a step of a Gatehouse run."""


def current_step() -> tuple[RunContext, ExecutionInfo]:
    """The run and the step (node or task) executing this code."""
    try:
        runtime = get_runtime()
    except RuntimeError:
        runtime = None
    context = getattr(runtime, "context", None)
    if not isinstance(context, RunContext) or runtime.execution_info is None:
        raise OutsideRun(
            "this helper records what it does in the thread, so it only works "
            "inside a node or task of an agent that Gatehouse runs"
        )
    return context, runtime.execution_info


def step_key(purpose: str, *parts: object) -> str:
    """A digest naming something done in the current step, the same every
    time LangGraph runs the step again (after a crash, a retry or a resume):
    tenant, thread, checkpoint namespace and id, and task id, plus `parts`.

    A step that a checkpoint migration moved to a new checkpoint (so LangGraph
    gave it a new task id) keeps the identity it had before the move.
    """
    context, info = current_step()
    step = context.step_aliases.get(info.task_id) or (
        info.checkpoint_ns,
        info.checkpoint_id,
        info.task_id,
    )
    material = "\x1f".join(
        str(part)
        for part in (purpose, context.tenant_id, context.thread_pk, *step, *parts)
    )
    return hashlib.sha256(material.encode()).hexdigest()
