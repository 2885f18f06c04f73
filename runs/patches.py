"""Patches: changing an agent while threads are paused in it.

A deploy changes an agent's code under threads that started on the old code
and are paused (waiting on an approval, or idle between runs). When they
continue, LangGraph runs their waiting node again from its first line, now
with the new code. A patch lets that code take the old path for those threads
and the new path for threads that start after the deploy:

    if durable.patched("add-fraud-check"):
        check_for_fraud(order)

and the agent version declares the patches it knows, on its factory or
entrypoint: `build_graph.patches = {"add-fraud-check"}`. A thread records the
patches of the version it starts on (`Thread.patches`, set when it is pinned);
`patched(name)` answers whether the thread has the patch. When the old path is
removed for good, the name moves to `retired_patches`: the version then
refuses threads that started without it.

A version can continue a thread when it knows every patch the thread took and
the thread took every patch the version retired; otherwise running or resuming
the thread is refused as version skew (`ensure_fits`), and `manage.py
agents_check` lists the threads in that state, with those whose version is no
longer registered.
"""

from __future__ import annotations

from collections.abc import Iterable

from runs import registry
from runs.context import current_step
from runs.errors import VersionSkew


class UndeclaredPatch(LookupError):
    """`patched(name)` asked about a patch the agent version does not declare."""


def patched(name: str) -> bool:
    """Whether the thread running this step started with patch `name`."""
    context, _ = current_step()
    if name in context.retired_patches:
        return True
    if name not in context.known_patches:
        raise UndeclaredPatch(
            f"patched({name!r}): the agent version does not declare patch {name!r}; "
            "add it to the factory's `patches` (threads that started before it "
            "then take the old path)"
        )
    return name in context.patches


def misfit(patches: Iterable[str], spec: registry.AgentSpec) -> str:
    """Why `spec` cannot continue a thread that took `patches` ("" if it can)."""
    patches = set(patches)
    unknown = sorted(patches - spec.patches - spec.retired_patches)
    if unknown:
        return (
            f"it took patch {unknown[0]!r}, which agent {spec.key} does not "
            "declare (a deploy without it, or a rollback)"
        )
    missing = sorted(spec.retired_patches - patches)
    if missing:
        return (
            f"it started before patch {missing[0]!r}, whose old path agent "
            f"{spec.key} has retired"
        )
    return ""


def ensure_fits(thread, spec: registry.AgentSpec) -> None:
    """VersionSkew when `spec` cannot continue the thread (see `misfit`)."""
    reason = misfit(thread.patches, spec)
    if reason:
        raise VersionSkew(
            f"thread {thread.thread_id} cannot continue on this code: {reason}; "
            "deploy a version that can, or migrate the thread (threads_migrate)"
        )
