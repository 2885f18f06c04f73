"""What an agent's code may use to stay correct when it runs more than once.

Gatehouse runs an agent's steps at least once: LangGraph runs an interrupted
node again from its first line when the thread resumes, and a step cut short by
a crash runs again on another worker. These helpers make that safe, in
LangGraph's idiom, with Gatehouse's ledger, encryption and audit behind them
(docs/writing-agents.md shows each one in a complete agent):

- `now()`, `random()`, `uuid4()`, `Random()`: values drawn from the world,
  recorded (encrypted) the first time a step runs and returned again, in the
  same order, every time it runs again.
- `side_effect(tool, args, perform, ...)`: a call to another system made once
  per step, with an idempotency key that is the same on every retry; with a
  `RetryPolicy` and a timeout per attempt, and a compensation that undoes it
  if the run fails for good later (a saga: runs.compensation).
- `patched(name)`: whether the thread started after patch `name` was
  deployed, so that a change to an agent does not change the path of threads
  paused in it.

They work inside the nodes of a `StateGraph` agent and inside the
`@entrypoint` and `@task`s of a Functional API agent that Gatehouse runs;
elsewhere they raise `OutsideRun`.
"""

from runs.context import OutsideRun
from runs.patches import UndeclaredPatch, patched
from runs.replay import NonDeterministicStep, Random, now, random, uuid4
from runs.tools import (
    ActivityFailed,
    ActivityTimedOut,
    RetryPolicy,
    idempotency_key,
    side_effect,
)

__all__ = [
    "ActivityFailed",
    "ActivityTimedOut",
    "NonDeterministicStep",
    "OutsideRun",
    "Random",
    "RetryPolicy",
    "UndeclaredPatch",
    "idempotency_key",
    "now",
    "patched",
    "random",
    "side_effect",
    "uuid4",
]
