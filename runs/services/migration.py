"""Checkpoint migration: moving paused threads to a new agent version.

The third way to change an agent under paused threads (the others are pinning
and patches, runs.patches): a migration function turns the state a thread
holds under the old version into the state the new version expects, and
`thread_migrate` writes the result as a new checkpoint under the new version.

For one thread, in one transaction under the thread's row lock:

1. The thread must still be paused on the old version: idle or interrupted,
   no run queued or running, and its state not in delta channels.
2. The function gets a copy of the latest state's values and returns the new
   values; every key must be a channel of the new version's state.
3. The nodes the thread waits at must exist in the new graph, and what is
   pending there must be interrupts or their answers only (a step that
   finished beside the waiting one has writes the new graph cannot take).
4. The new checkpoint is the old one with the changed channels replaced,
   the removed ones dropped, and the pending interrupts carried over. LangGraph
   derives a waiting task's id, and so its interrupts' ids, from the
   checkpoint's id: the interrupts get their new ids, and `interrupts_moved`
   tells approvals, so that a pending request still resumes its interrupt.
   The waiting steps keep their identity (`Thread.step_aliases`), so when they
   run again they find the values they recorded (runs.replay) and the tool
   calls they made (runs.tools) before the move.
5. The thread is pinned to the new version with its patches, and
   `thread.migrated` is audited with counts, never keys or values.

A thread that fails any check is reported with the reason and left as it
was. `--dry-run` stops after step 3 and reports what would change: the keys
added, removed and changed, without their values.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.db import transaction
from langgraph.checkpoint.base import copy_checkpoint
from langgraph.checkpoint.base.id import uuid6

# LangGraph's own derivations of a task's path and an interrupt's id (private
# names, pinned with langgraph in requirements.txt): a carried interrupt must
# get exactly the id LangGraph will look for when the thread resumes.
from langgraph.pregel._algo import task_path_str
from langgraph.types import Interrupt, _interrupt_id

from audit import events
from audit.services import Actor, record
from runs import registry
from runs.graphs import compiled, thread_config
from runs.models import Run, Thread
from runs.signals import interrupts_moved

# LangGraph's special channels of a pending interrupt and of its answers.
INTERRUPT, RESUME = "__interrupt__", "__resume__"
# What may be pending on a paused thread's checkpoint: its interrupts and the
# answers to earlier interrupts of the same step.
CARRIED_CHANNELS = {INTERRUPT, RESUME}
PAUSED = (Thread.Status.IDLE, Thread.Status.INTERRUPTED)
# How many interrupts one step may have answered before the pending one.
_MAX_INTERRUPTS_PER_STEP = 100


class CannotMigrate(Exception):
    """The thread cannot be migrated; the message says why."""


@dataclass
class ThreadMigration:
    """What migrating one thread changed (or would change), by key name."""

    thread: Thread
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    problem: str = ""

    @property
    def label(self) -> str:
        return f"{self.thread.tenant.slug}/{self.thread.thread_id}"


def migration_candidates(*, agent: str, version: str, tenant=None):
    """The live, paused threads of agent@version, by primary key."""
    threads = Thread.objects.live().filter(
        agent_name=agent, agent_version=version, status__in=PAUSED
    )
    if tenant is not None:
        threads = threads.for_tenant(tenant)
    return threads.order_by("pk")


def key_diff(before: dict, after: dict) -> tuple[list[str], list[str], list[str]]:
    """Keys added, removed and changed from `before` to `after`."""
    added = sorted(set(after) - set(before))
    removed = sorted(set(before) - set(after))
    changed = sorted(
        key for key in set(before) & set(after) if before[key] != after[key]
    )
    return added, removed, changed


def thread_migrate(
    *,
    thread: Thread,
    target: registry.AgentSpec,
    migrate: Callable[[dict], dict],
    function_name: str,
    actor: Actor,
    dry_run: bool = False,
) -> ThreadMigration:
    """Migrate one paused thread to `target` (see the module docstring)."""
    result = ThreadMigration(thread=thread)
    try:
        with transaction.atomic():
            _migrate(
                result,
                target=target,
                migrate=migrate,
                function_name=function_name,
                actor=actor,
                dry_run=dry_run,
            )
    except CannotMigrate as problem:
        result.problem = str(problem)
    return result


def _migrate(
    result: ThreadMigration,
    *,
    target: registry.AgentSpec,
    migrate: Callable[[dict], dict],
    function_name: str,
    actor: Actor,
    dry_run: bool,
) -> None:
    thread = (
        Thread.objects.select_related("tenant")
        .select_for_update(of=("self",), no_key=True)
        .get(pk=result.thread.pk)
    )
    result.thread = thread
    source = _paused_on_source(thread, target)
    old_graph = compiled(source, thread.tenant)
    new_graph = compiled(target, thread.tenant)
    saver = old_graph.checkpointer
    saved = saver.get_tuple(thread_config(thread))
    if saved is None:
        raise CannotMigrate("it has no checkpoint yet")
    snapshot = old_graph.get_state(saved.config)
    before = dict(snapshot.values)
    after = _migrated_values(migrate, before, new_graph, target)
    result.added, result.removed, result.changed = key_diff(before, after)
    missing = [node for node in snapshot.next if node not in new_graph.nodes]
    if missing:
        raise CannotMigrate(
            f"it waits at node {missing[0]!r}, which agent {target.key} does not have"
        )
    unsettled = sorted(
        {channel for _, channel, _ in saved.pending_writes or ()} - CARRIED_CHANNELS
    )
    if unsettled:
        raise CannotMigrate(
            "a step that finished beside the waiting one has writes not applied "
            f"yet ({', '.join(unsettled)}); resume it on {source.key} first"
        )
    if dry_run:
        return

    new_config = _put_checkpoint(saver, saved, before, after, result, target)
    moved = _carry_pending(saver, saved, snapshot, new_graph, new_config)
    thread.step_aliases = _step_aliases(thread, saved, snapshot, new_graph, new_config)
    state = new_graph.get_state(new_config)
    if list(state.next) != list(snapshot.next) or sorted(
        item.id for item in state.interrupts
    ) != sorted(moved.values()):
        raise CannotMigrate(
            f"under {target.key} the new checkpoint does not wait where the old one "
            "did; nothing was changed"
        )
    if moved:
        interrupts_moved.send(sender=Thread, thread=thread, moved=moved)
    thread.agent_version = target.version
    thread.patches = sorted(target.patches | target.retired_patches)
    thread.save(
        update_fields=["agent_version", "patches", "step_aliases", "updated_at"]
    )
    record(
        tenant=thread.tenant,
        kind=events.THREAD_MIGRATED,
        actor=actor,
        thread_id=thread.thread_id,
        data={
            "agent": thread.agent_name,
            "from_version": source.version,
            "to_version": target.version,
            "function": function_name[:200],
            "added": len(result.added),
            "removed": len(result.removed),
            "changed": len(result.changed),
            "checkpoint_id": new_config["configurable"]["checkpoint_id"],
        },
    )


def _paused_on_source(thread: Thread, target: registry.AgentSpec):
    if thread.deleted_at is not None:
        raise CannotMigrate("it was deleted")
    if (
        thread.status not in PAUSED
        or Run.objects.filter(thread=thread, status__in=Run.ACTIVE).exists()
    ):
        raise CannotMigrate(f"it is not paused (status {thread.status})")
    if thread.uses_delta_channels:
        raise CannotMigrate("its state is kept in delta channels")
    try:
        source = registry.get(thread.agent_name, thread.agent_version)
    except registry.UnknownAgent as exc:
        raise CannotMigrate(str(exc)) from None
    if source.is_functional or target.is_functional:
        raise CannotMigrate(
            "Functional API threads keep no state by key; migrate graph agents only"
        )
    return source


def _migrated_values(migrate, before: dict, new_graph, target) -> dict:
    try:
        after = migrate(copy.deepcopy(before))
    except Exception as exc:
        # The type only: an exception's text may quote the state.
        raise CannotMigrate(
            f"the migration function raised {type(exc).__name__}"
        ) from None
    if not isinstance(after, dict):
        raise CannotMigrate(
            f"the migration function returned {type(after).__name__}, not a dict"
        )
    unknown = sorted(key for key in after if key not in new_graph.channels)
    if unknown:
        raise CannotMigrate(
            f"the migrated state has key {unknown[0]!r}, which agent {target.key}'s "
            "state does not"
        )
    return after


def _put_checkpoint(saver, saved, before, after, result, target) -> dict:
    """The old checkpoint with the migrated values, as its child."""
    checkpoint = copy_checkpoint(saved.checkpoint)
    step = saved.metadata.get("step", -1) + 1
    checkpoint["id"] = str(uuid6(clock_seq=step))
    checkpoint["ts"] = datetime.now(UTC).isoformat()
    for key in result.removed:
        checkpoint["channel_values"].pop(key, None)
        checkpoint["channel_versions"].pop(key, None)
    new_versions = {}
    for key in result.added + result.changed:
        version = saver.get_next_version(checkpoint["channel_versions"].get(key), None)
        checkpoint["channel_versions"][key] = new_versions[key] = version
        checkpoint["channel_values"][key] = after[key]
    # `updated_channels` stays the old checkpoint's: LangGraph schedules the
    # next step from it, and the thread must wait where it waited.
    metadata = {
        "source": "update",
        "step": step,
        "parents": saved.metadata.get("parents", {}),
        "migrated_to": target.key,
    }
    return saver.put(saved.config, checkpoint, metadata, new_versions)


def _carry_pending(saver, saved, snapshot, new_graph, new_config) -> dict[str, str]:
    """Write the old checkpoint's interrupts (and answers) for the new one's
    tasks; {old interrupt id: new interrupt id}."""
    if not saved.pending_writes:
        return {}
    old_tasks = {task.id: task for task in snapshot.tasks}
    new_tasks = {task.name: task for task in new_graph.get_state(new_config).tasks}
    moved: dict[str, str] = {}
    writes: dict[str, list[tuple[str, Any]]] = defaultdict(list)
    for task_id, channel, value in saved.pending_writes:
        old = old_tasks.get(task_id)
        new = new_tasks.get(old.name) if old else None
        if new is None:
            raise CannotMigrate("a pending interrupt belongs to no waiting node")
        if channel == INTERRUPT:
            value = [
                Interrupt(value=item.value, id=_moved_id(item.id, old, new, moved))
                for item in value
            ]
        writes[new.id].append((channel, value))
    for task_id, task_writes in writes.items():
        task = next(t for t in new_tasks.values() if t.id == task_id)
        saver.put_writes(new_config, task_writes, task_id, task_path_str(task.path))
    return moved


def _step_aliases(thread, saved, snapshot, new_graph, new_config) -> dict:
    """{new task id: identity of the step before the move} for the steps the
    thread waits at, so that they find the values they recorded and the tool
    calls they made (runs.context.step_key). A step moved twice keeps its
    first identity."""
    old_checkpoint_id = saved.config["configurable"]["checkpoint_id"]
    new_tasks = {task.name: task for task in new_graph.get_state(new_config).tasks}
    aliases = {}
    for old in snapshot.tasks:
        new = new_tasks.get(old.name)
        if new is not None:
            aliases[new.id] = thread.step_aliases.get(old.id) or [
                f"{old.name}:{old.id}",
                old_checkpoint_id,
                old.id,
            ]
    return aliases


def _moved_id(old_id: str, old_task, new_task, moved: dict[str, str]) -> str:
    """The interrupt's id in the new task: same position, new namespace."""
    old_ns, new_ns = f"{old_task.name}:{old_task.id}", f"{new_task.name}:{new_task.id}"
    for position in range(_MAX_INTERRUPTS_PER_STEP):
        if _interrupt_id(old_ns, position) == old_id:
            moved[old_id] = _interrupt_id(new_ns, position)
            return moved[old_id]
    raise CannotMigrate(f"interrupt {old_id} is not one LangGraph would name")
