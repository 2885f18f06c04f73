"""The approval gate as runs enforces it: nothing continues past a gate except
a decision on its request.

An interrupt whose payload carries `action` is an approval gate (api.md); any
other interrupt is an input interrupt, which the thread's client may resume
with any value. The checks below run inside the services that change a
thread's state (runs.services: a resume, a fork or state update, a run from a
checkpoint), under the thread's row lock. The REST API, the admin, management
commands and the Agent Protocol API reach thread state only through those
services, so they all get the rule.

runs does not import approvals. The approvals app registers a gatekeeper when
it starts (`register_gatekeeper`, from its AppConfig.ready()). The gatekeeper
answers two questions: which requests are open on a thread, and with what
value a settled request resumes its interrupt. That value is stored when the
request is decided, before the resume, in the same transaction; a gate is
resumed only with exactly that value. With no gatekeeper registered, no gate
can be resumed: the rule fails closed.

Where a thread's gates are: the nodes its agent declares
(`runs.actions.GatedAction.node`) and the nodes that stopped at a gate on this
thread (`Thread.gated_nodes`, recorded when a run stops). The nodes "past a
gate" are those reachable from a gated node in the graph without crossing a
gated node again. Continuing at one of them from a checkpoint that a fork
wrote, or from an old checkpoint, would act on a decision nobody took, or act
twice on one decision; both are refused.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Mapping
from typing import Any, Protocol

from langgraph.constants import CONFIG_KEY_CHECKPOINTER
from langgraph.graph import END

from runs import registry
from runs.errors import ApprovalRequired
from runs.graphs import thread_config
from runs.models import Thread


def is_gate(value: Any) -> bool:
    """Whether an interrupt's payload makes it an approval gate."""
    return isinstance(value, Mapping) and "action" in value


class Gatekeeper(Protocol):
    def open_requests(
        self, thread: Thread, interrupt_ids: Collection[str] | None = None
    ) -> list[str]:
        """Ids of the thread's pending approval requests, oldest first; only
        those of `interrupt_ids` when given."""

    def decided_resumes(
        self, thread: Thread, interrupt_ids: Collection[str]
    ) -> dict[str, Any]:
        """{interrupt id: resume value} for the interrupts among
        `interrupt_ids` whose request is settled (approved, denied, expired)."""


class _NoGatekeeper:
    def open_requests(self, thread, interrupt_ids=None) -> list[str]:
        return []

    def decided_resumes(self, thread, interrupt_ids) -> dict[str, Any]:
        return {}


_gatekeeper: Gatekeeper = _NoGatekeeper()


def register_gatekeeper(keeper: Gatekeeper) -> None:
    global _gatekeeper
    _gatekeeper = keeper


def gatekeeper() -> Gatekeeper:
    return _gatekeeper


# --- Where the gates are --------------------------------------------------------


def _successors(graph) -> dict[str, set[str]]:
    """Each node's possible next nodes. A branch that declares no destinations
    may go anywhere, so it counts as leading to every node."""
    succ: dict[str, set[str]] = defaultdict(set)
    builder = getattr(graph, "builder", None)
    if builder is None:  # not a StateGraph (the Functional API): its drawing
        for edge in graph.get_graph().edges:
            succ[edge.source].add(edge.target)
        return succ
    nodes = set(builder.nodes)
    for start, end in builder.edges:
        succ[start].add(end)
    for starts, end in builder.waiting_edges:
        for start in starts:
            succ[start].add(end)
    for source, branches in builder.branches.items():
        for branch in branches.values():
            succ[source] |= set(branch.ends.values()) if branch.ends else nodes
    for name, spec in builder.nodes.items():
        ends = spec.ends or ()
        succ[name] |= set(ends.values() if isinstance(ends, Mapping) else ends)
    return succ


def past_gates(graph, gated: Collection[str]) -> frozenset[str]:
    """The nodes reachable from a gated node without crossing a gated node."""
    succ = _successors(graph)
    stack = [node for gate in gated for node in succ.get(gate, ())]
    seen: set[str] = set()
    while stack:
        node = stack.pop()
        if node in seen or node in gated or node == END:
            continue
        seen.add(node)
        stack.extend(succ.get(node, ()))
    return frozenset(seen)


def declared_gated_nodes(thread: Thread) -> frozenset[str] | None:
    """The gated nodes the thread's agent version declares; None if it declares
    none (not even an empty list)."""
    spec = registry.get(thread.agent_name, thread.agent_version)
    return spec.gated_nodes


def gated_nodes(thread: Thread) -> frozenset[str]:
    """Declared and observed gated nodes of the thread."""
    return (declared_gated_nodes(thread) or frozenset()) | set(thread.gated_nodes)


def gate_nodes_of(snapshot) -> list[str]:
    """The nodes of a state snapshot that wait on an approval gate."""
    return sorted(
        {
            task.name
            for task in snapshot.tasks
            if any(is_gate(interrupt.value) for interrupt in task.interrupts)
        }
    )


# --- The checks --------------------------------------------------------------------


def _ids_text(ids: list[str]) -> str:
    return ", ".join(ids) if ids else "none open"


def require_no_open_request(thread: Thread, doing: str) -> None:
    open_ids = gatekeeper().open_requests(thread)
    if open_ids:
        raise ApprovalRequired(
            f"thread {thread.thread_id} waits on approval request(s) "
            f"{_ids_text(open_ids)}: {doing} is refused until they are decided",
            approval_ids=open_ids,
        )


def check_resume(
    *,
    thread: Thread,
    graph,
    resume: Any,
    settled: Mapping[str, Any] | None = None,
    saver=None,
) -> None:
    """Refuse a resume that would continue a gate other than with the value
    its request was decided with.

    A mapping whose keys are all pending interrupt ids resumes those
    interrupts; any other value counts as resuming every pending interrupt.
    That includes a mapping that names an interrupt the thread no longer
    waits on: LangGraph numbers the interrupts of one task and resumes the
    task's next interrupt with a value keyed by its first one's id, so the
    value of a settled gate, keyed by its id, would answer the next gate of
    the same node.

    `settled`: {interrupt id: resume value} of the requests the caller
    settled in this transaction, holding their rows and the thread's locked
    (the decision that resumes the run): what the gatekeeper would answer for
    those interrupts, so they are not read back. The pending interrupts are
    read from the checkpoint all the same: the rule holds for a value that
    names an interrupt the thread no longer waits on.

    `saver`: the checkpoint saver the state is read through, if not the
    graph's (one that answers the thread's latest checkpoint, read already
    in this transaction: runs.checkpointer's latest_after).
    """
    config = thread_config(thread)
    if saver is not None:
        config["configurable"][CONFIG_KEY_CHECKPOINTER] = saver
    pending = {
        interrupt.id: interrupt.value
        for interrupt in graph.get_state(config).interrupts
    }
    if (
        isinstance(resume, Mapping)
        and resume
        and all(str(key) in pending for key in resume)
    ):
        values = {str(key): value for key, value in resume.items()}
    else:
        values = {interrupt_id: resume for interrupt_id in pending}
    keeper = gatekeeper()
    settled = settled or {}
    asked = [interrupt_id for interrupt_id in values if interrupt_id not in settled]
    decided = {**(keeper.decided_resumes(thread, asked) if asked else {}), **settled}
    blocked = [
        interrupt_id
        for interrupt_id, value in values.items()
        if (interrupt_id in decided and value != decided[interrupt_id])
        or (interrupt_id not in decided and is_gate(pending.get(interrupt_id)))
    ]
    if blocked:
        open_ids = keeper.open_requests(thread, blocked)
        raise ApprovalRequired(
            f"interrupt(s) {', '.join(blocked)} of thread {thread.thread_id} are "
            "approval gates: a gate is resumed only by a decision on its approval "
            f"request ({_ids_text(open_ids)}), never by a raw resume",
            approval_ids=open_ids,
        )


def check_fork(*, thread: Thread, graph, as_node: str | None) -> None:
    """Before a fork or state update: no open request; no write as a gated node
    or a node past one."""
    require_no_open_request(thread, "a fork or state update")
    if as_node is None:
        return
    declared = declared_gated_nodes(thread)
    if declared is None:
        raise ApprovalRequired(
            f"agent {thread.agent_name}@{thread.agent_version} declares no gated "
            "actions, so Gatehouse cannot tell whether writing as node "
            f"{as_node!r} skips an approval gate; a fork with as_node is refused"
        )
    gated = declared | set(thread.gated_nodes)
    if as_node in gated:
        raise ApprovalRequired(
            f"node {as_node!r} asks for an approval: writing as it would stand in "
            "for a decision nobody took"
        )
    if as_node in past_gates(graph, gated):
        raise ApprovalRequired(
            f"node {as_node!r} comes after an approval gate: writing as it would "
            "skip the gate's decision"
        )


def check_continuation(*, thread: Thread, graph, next_nodes, doing: str) -> None:
    """Refuse to continue at nodes past a gate from a checkpoint whose gate
    decision was not taken for this continuation (a fork's new checkpoint, an
    old checkpoint replayed)."""
    past = sorted(set(next_nodes) & past_gates(graph, gated_nodes(thread)))
    if past:
        raise ApprovalRequired(
            f"{doing} would continue at {', '.join(past)}, past an approval gate, "
            "without a decision taken for it: fork or run from a checkpoint "
            "before the gate, so that the gate asks again"
        )
