"""Small deterministic agents that tests register through GATEHOUSE_AGENTS."""

import operator
import time
from pathlib import Path
from typing import Annotated, TypedDict

from django.conf import settings
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langgraph.config import get_stream_writer
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.runtime import get_runtime
from langgraph.types import interrupt

from demo import downstream as demo_services
from gatehouse import durable
from runs.actions import GatedAction
from runs.tools import side_effect


def one_node(state, name: str, node) -> StateGraph:
    """START -> `name` -> END."""
    graph = StateGraph(state)
    graph.add_node(name, node)
    graph.add_edge(START, name)
    graph.add_edge(name, END)
    return graph


class EchoState(TypedDict, total=False):
    text: str
    echoed: str


def _echo(state: EchoState) -> EchoState:
    return {"echoed": state.get("text", "")}


def echo_graph() -> StateGraph:
    """Echoes its input text back; used by the test suite."""
    return one_node(EchoState, "echo", _echo)


class GateState(TypedDict, total=False):
    answers: Annotated[list, operator.add]


def _gate_payload(label: str) -> dict:
    return {
        "action": f"do_{label}",
        "args": {"label": label},
        "reason": f"because {label}",
        "affects": f"the {label} thing",
        "if_denied": "nothing happens",
    }


def _ask(label: str, *, slow_after: float = 0.0, payload: dict | None = None):
    def node(state: GateState) -> GateState:
        answer = interrupt(payload or _gate_payload(label))
        time.sleep(slow_after)
        return {"answers": [{label: answer}]}

    node.__name__ = f"ask_{label}"
    return node


def gate_graph() -> StateGraph:
    """Asks for one approval, then ends."""
    return one_node(GateState, "ask", _ask("one"))


def gate_graph_renamed() -> StateGraph:
    """The same agent after a deploy that renamed its node (version skew)."""
    return one_node(GateState, "ask_renamed", _ask("one"))


def _pair(slow_after: float) -> StateGraph:
    graph = StateGraph(GateState)
    graph.add_node("left", _ask("left", slow_after=slow_after))
    graph.add_node("right", _ask("right"))
    graph.add_edge(START, "left")
    graph.add_edge(START, "right")
    graph.add_edge("left", END)
    graph.add_edge("right", END)
    return graph


def pair_graph() -> StateGraph:
    """Two parallel branches, each waiting on its own approval; the first is
    slow after its approval, so a second decision arrives mid-run."""
    return _pair(slow_after=1.5)


def duo_graph() -> StateGraph:
    """The pair without the wait: each decision's run is over in moments."""
    return _pair(slow_after=0.0)


def _ask_twice(state: GateState) -> GateState:
    # Two gates in one node: LangGraph numbers a task's interrupts, and a
    # resume keyed by the task's first interrupt id reaches its next one.
    first = interrupt(_gate_payload("first"))
    second = interrupt(_gate_payload("second"))
    return {"answers": [{"first": first}, {"second": second}]}


def twice_graph() -> StateGraph:
    """Asks for two approvals in one node, one after the other."""
    return one_node(GateState, "ask", _ask_twice)


twice_graph.actions = [
    GatedAction(name="do_first", node="ask"),
    GatedAction(name="do_second", node="ask"),
]


def incomplete_payload_graph() -> StateGraph:
    """Interrupts with a payload that lacks reason, affects and if_denied."""
    return one_node(
        GateState, "ask", _ask("bad", payload={"action": "do_bad", "args": {}})
    )


class QuestionState(TypedDict, total=False):
    answer: str


def _question(state: QuestionState) -> QuestionState:
    # No "action": an input interrupt, which the thread's client resumes.
    return {"answer": interrupt({"question": "Which order is it about?"})}


def question_graph() -> StateGraph:
    """Asks the end user a question (an input interrupt), then ends."""
    return one_node(QuestionState, "question", _question)


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


# --- Agents of the Agent Protocol tests (tests/agent_protocol) -------------


class ChatState(TypedDict, total=False):
    messages: Annotated[list, add_messages]
    name: str


class SlowWordsModel(GenericFakeChatModel):
    """A chat model that streams its answer word by word, each word a little
    after the previous one, as a real model streams tokens."""

    delay: float = 0.0

    def _stream(self, *args, **kwargs):
        for chunk in super()._stream(*args, **kwargs):
            time.sleep(self.delay)
            yield chunk


def _ask_name(state: ChatState) -> ChatState:
    # An input interrupt: a question to the user, no `action`: not a gate.
    return {"name": interrupt({"question": "What is your name?"})}


def _greet(state: ChatState) -> ChatState:
    get_stream_writer()({"greeting_for": state["name"]})
    model = SlowWordsModel(
        messages=iter([AIMessage(content=f"Hello {state['name']}, nice to meet you.")]),
        delay=0.15,
    )
    return {"messages": [model.invoke(state.get("messages", []))]}


def _chain(state: type, *nodes) -> StateGraph:
    """A graph that runs `nodes` one after the other."""
    graph = StateGraph(state)
    previous = START
    for node in nodes:
        graph.add_node(node.__name__.lstrip("_"), node)
        graph.add_edge(previous, node.__name__.lstrip("_"))
        previous = node.__name__.lstrip("_")
    graph.add_edge(previous, END)
    return graph


def chat_graph() -> StateGraph:
    """Asks the user's name (an input interrupt), then greets them word by word."""
    return _chain(ChatState, _ask_name, _greet)


chat_graph.safe_metadata_keys = frozenset({"channel", "topic"})


class PayState(TypedDict, total=False):
    amount: str
    confirmed: str
    payment: dict


def _confirm(state: PayState) -> PayState:
    return {"confirmed": interrupt({"question": f"Pay {state['amount']} EUR?"})}


def _pay(state: PayState) -> PayState:
    tenant_id = get_runtime().context.tenant_id
    payment = side_effect(
        "payments.refund",
        {"amount": state["amount"]},
        lambda key: demo_services.refund_payment(
            tenant_id=tenant_id,
            idempotency_key=key,
            order_id="race",
            amount=state["amount"],
            currency="EUR",
        ),
    )
    return {"payment": payment}


def pay_graph() -> StateGraph:
    """Asks the user to confirm (an input interrupt), then pays once."""
    return _chain(PayState, _confirm, _pay)


class TickState(TypedDict, total=False):
    ticks: Annotated[list, operator.add]


def _tick(number: int, seconds: float = 0.4):
    def node(state: TickState) -> TickState:
        time.sleep(seconds)
        return {"ticks": [number]}

    node.__name__ = f"tick_{number}"
    return node


def slow_graph() -> StateGraph:
    """Five steps of 0.4 s each: long enough to be cancelled or queued behind."""
    return _chain(TickState, *(_tick(number) for number in range(1, 6)))


def long_graph() -> StateGraph:
    """Eight steps of a second each: in flight across a service's restart."""
    return _chain(TickState, *(_tick(number, 1.0) for number in range(1, 9)))


# The test agents above ask no approval: they declare no gated actions.
chat_graph.actions = []
pay_graph.actions = []
slow_graph.actions = []
long_graph.actions = []


class FanOutState(TypedDict, total=False):
    drawn: Annotated[list, operator.add]


def _draw(label: str):
    def node(state: FanOutState) -> FanOutState:
        return {"drawn": [durable.random()]}  # recorded in the database

    node.__name__ = f"draw_{label}"
    return node


def fan_out_graph() -> StateGraph:
    """Three nodes at once (on LangGraph's executor threads), each recording a
    replay-safe value: database work off the run's own thread."""
    graph = StateGraph(FanOutState)
    for label in "abc":
        graph.add_node(label, _draw(label))
        graph.add_edge(START, label)
        graph.add_edge(label, END)
    return graph
