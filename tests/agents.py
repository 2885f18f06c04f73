"""Small deterministic agents that tests register through GATEHOUSE_AGENTS."""

from typing import TypedDict

from langgraph.graph import END, START, StateGraph


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
