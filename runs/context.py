"""What a graph's nodes know about the Gatehouse run executing them.

Passed as LangGraph's runtime context (`graph.invoke(..., context=...)`),
which is never persisted; nodes and `runs.tools` read it with
`langgraph.runtime.get_runtime().context`.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class RunContext:
    tenant_id: int
    thread_pk: int
    run_id: str
