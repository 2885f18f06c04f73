"""Small deterministic agents that tests register through GATEHOUSE_AGENTS."""

import operator
import time
from pathlib import Path
from typing import Annotated, TypedDict

from django.conf import settings
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import get_runtime
from langgraph.types import interrupt

from runs.actions import GatedAction


class EchoState(TypedDict, total=False):
    text: str
    echoed: str


def _echo(state: EchoState) -> EchoState:
    return {"echoed": state.get("text", "")}


def echo_graph() -> StateGraph:
    """Echoes its input text back; used by the test suite."""
    graph = StateGraph(EchoState)
    graph.add_node("echo", _echo)
    graph.add_edge(START, "echo")
    graph.add_edge("echo", END)
    return graph


class GateState(TypedDict, total=False):
    answers: Annotated[list, operator.add]


def _ask(label: str, *, slow_after: float = 0.0, payload: dict | None = None):
    def node(state: GateState) -> GateState:
        answer = interrupt(
            payload
            or {
                "action": f"do_{label}",
                "args": {"label": label},
                "reason": f"because {label}",
                "affects": f"the {label} thing",
                "if_denied": "nothing happens",
            }
        )
        time.sleep(slow_after)
        return {"answers": [{label: answer}]}

    node.__name__ = f"ask_{label}"
    return node


def gate_graph() -> StateGraph:
    """Asks for one approval, then ends."""
    graph = StateGraph(GateState)
    graph.add_node("ask", _ask("one"))
    graph.add_edge(START, "ask")
    graph.add_edge("ask", END)
    return graph


def gate_graph_renamed() -> StateGraph:
    """The same agent after a deploy that renamed its node (version skew)."""
    graph = StateGraph(GateState)
    graph.add_node("ask_renamed", _ask("one"))
    graph.add_edge(START, "ask_renamed")
    graph.add_edge("ask_renamed", END)
    return graph


def pair_graph() -> StateGraph:
    """Two parallel branches, each waiting on its own approval; the first is
    slow after its approval, so a second decision arrives mid-run."""
    graph = StateGraph(GateState)
    graph.add_node("left", _ask("left", slow_after=1.5))
    graph.add_node("right", _ask("right"))
    graph.add_edge(START, "left")
    graph.add_edge(START, "right")
    graph.add_edge("left", END)
    graph.add_edge("right", END)
    return graph


def incomplete_payload_graph() -> StateGraph:
    """Interrupts with a payload that lacks reason, affects and if_denied."""
    graph = StateGraph(GateState)
    graph.add_node("ask", _ask("bad", payload={"action": "do_bad", "args": {}}))
    graph.add_edge(START, "ask")
    graph.add_edge("ask", END)
    return graph


class QuestionState(TypedDict, total=False):
    answer: str


def _question(state: QuestionState) -> QuestionState:
    # No "action": an input interrupt, which the thread's client resumes.
    return {"answer": interrupt({"question": "Which order is it about?"})}


def question_graph() -> StateGraph:
    """Asks the end user a question (an input interrupt), then ends."""
    graph = StateGraph(QuestionState)
    graph.add_node("question", _question)
    graph.add_edge(START, "question")
    graph.add_edge("question", END)
    return graph


question_graph.actions = []  # declares that it has no approval gates


def provider_marker(thread_pk: int) -> Path:
    """While this file is missing, the flaky agent's provider is down."""
    return Path(settings.VAR_DIR) / f"provider-up-{thread_pk}"


def _act(state: GateState) -> GateState:
    if not provider_marker(get_runtime().context.thread_pk).exists():
        raise RuntimeError("the provider is down")
    return {"answers": [{"acted": True}]}


def flaky_graph() -> StateGraph:
    """Asks for one approval, then acts through a provider that may be down."""
    graph = StateGraph(GateState)
    graph.add_node("ask", _ask("one"))
    graph.add_node("act", _act)
    graph.add_edge(START, "ask")
    graph.add_edge("ask", "act")
    graph.add_edge("act", END)
    return graph


flaky_graph.actions = [GatedAction(name="do_one", node="ask")]
