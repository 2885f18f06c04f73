"""What the side-by-side benchmark's engines share: the workload and its timing.

Every engine runs the same refund case: plan (the demo agent's deterministic
planner model), wait for a human decision, pay, notify. A *flow* is one
complete case driven the way a client drives it, timed in three places:

- `start_to_waiting`: from starting the case to the client knowing it waits
  for approval;
- `decision_call`: the decision's delivery alone (Gatehouse's decision POST,
  DBOS's `send()`; the floor has none: its resume is in-process);
- `decision_to_succeeded`: from sending the decision to the client knowing
  the case succeeded.

An engine is a function `flow(index) -> dict` of those durations in seconds;
`latency_samples` runs it sequentially, `throughput` concurrently.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

MEASURES = ("start_to_waiting", "decision_call", "decision_to_succeeded")

Flow = Callable[[int], dict]


def refund_request(index: int) -> dict:
    """The case every engine runs: a damaged item, 40 EUR (medium risk)."""
    return {
        "customer_message": "It arrived damaged",
        "order": {"id": f"B-{index}", "amount": "40.00"},
    }


APPROVAL = {"approved": True, "note": "", "reviewer": "bench"}


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def latency_samples(flow: Flow, runs: int, first_index: int) -> list[dict]:
    """`runs` flows one after another."""
    return [flow(first_index + offset) for offset in range(runs)]


def throughput(flow: Flow, runs: int, concurrency: int, first_index: int) -> dict:
    """`runs` flows with `concurrency` in flight; wall-clock start and end.

    Times are `time.time()` so that several processes' windows can be merged.
    A flow that raises is counted, not retried: the rate counts complete runs.
    """
    failures: list[str] = []
    lock = threading.Lock()

    def one(index: int) -> None:
        try:
            flow(index)
        except Exception as exc:  # reported with the figure, not hidden
            with lock:
                failures.append(f"{type(exc).__name__}: {exc}"[:300])

    started = time.time()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        list(pool.map(one, range(first_index, first_index + runs)))
    return {
        "started": started,
        "ended": time.time(),
        "completed": runs - len(failures),
        "failures": failures[:5],
    }
