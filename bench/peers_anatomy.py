"""Where Gatehouse's two latencies go: each flow's timeline, phase by phase.

A flow's timeline is its marks in time order: the client's (bench/
peers_gatehouse.py `GatehouseClient.flow`: when it sent the start or the
decision, when it knew the outcome (its long poll answered) and, with the
`join` waiter, when the join answered before its status GET) and those the
system records anyway, read back from the database after the latency rounds:

- runs: `created_at` (the request's transaction), `started_at` (the worker's
  claim), `ended_at` (the outcome, in the end's transaction);
- audit events' `occurred_at` (run.queued, run.started, approval.requested,
  approval.decided, tool_call.*, run.succeeded, ...);
- checkpoints' `created_at` (one per super-step: which node finished);
- the ledger's tool calls, `started_at` and `finished_at`.

Everything runs on this machine, so client and server read one clock
(time.time() and Django's timezone.now() are both the system clock). A phase
is the time between two consecutive marks, named by both; its p50 is over
the flows whose timeline has that pair (`n`). The marks are taken where the
product already takes them, so a phase may cover more than its name: none
marks a commit, for one, so "run.queued → run claimed" holds the decision's
commit, the on-commit enqueue, Redis, the worker's prefetch and the claim.
The phases' p50s need not add up to the latency's p50.

Two kinds of marks stay off the two latencies' timelines: audit events of
reads (audit.events.READS: the web process records them as it answers a
client, beside the run's critical path: the `join` waiter's
`run.output_read` as the join starts waiting, say) and the client's marks of the answers to its start
and decision POSTs (the worker often claims the run before the client has
the answer). Each POST gets a timeline of its own instead, from the marks the
web process records while it serves it (reads included).
"""

from __future__ import annotations

import importlib.util
import statistics
import sys
from collections import defaultdict
from datetime import datetime
from pathlib import Path


def _audit_events():
    """audit/events.py, by its path: bench/audit.py (on sys.path first when a
    bench script runs) hides the `audit` package."""
    path = Path(__file__).resolve().parent.parent / "audit" / "events.py"
    spec = importlib.util.spec_from_file_location("gatehouse_audit_events", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look themselves up there
    spec.loader.exec_module(module)
    return module


READS = _audit_events().READS

# Appended to the label of an audit event of a read.
READ = " (read)"

# Each timeline: the client's marks that open and close it, the client's
# marks inside it (the `join` waiter's only), and whether it takes the web process's marks only (a POST)
# or all but the reads (a latency).
TIMELINES = {
    "start_to_waiting": ("start sent", "waiting known", ("start joined",), False),
    "decision_to_succeeded": (
        "decision sent",
        "succeeded known",
        ("resume joined",),
        False,
    ),
    "start POST": ("start sent", "start answered", (), True),
    "decision POST": ("decision sent", "decision answered", (), True),
}
# What the web process records while it serves a start or a decision POST
# (besides reads); every other mark is the worker's.
WEB_EVENTS = frozenset(
    {
        "start run created",
        "resume run created",
        "audit run.queued",
        "audit approval.decided",
    }
)


def server_marks(database_url: str, thread_ids: list[str]) -> dict[str, list]:
    """(label, time.time() seconds) the database holds, by client thread id."""
    import psycopg

    marks: dict[str, list[tuple[str, float]]] = defaultdict(list)

    def add(thread_id: str, label: str, at: datetime | None) -> None:
        if at is not None:
            marks[thread_id].append((label, at.timestamp()))

    with psycopg.connect(database_url, autocommit=True) as conn:
        for thread_id, kind, created, started, ended in conn.execute(
            "SELECT t.thread_id, r.kind, r.created_at, r.started_at, r.ended_at "
            "FROM runs_run r JOIN runs_thread t ON t.id = r.thread_id "
            "WHERE t.thread_id = ANY(%s)",
            [thread_ids],
        ):
            add(thread_id, f"{kind} run created", created)
            add(thread_id, f"{kind} run claimed", started)
            add(thread_id, f"{kind} run ended", ended)
        for thread_id, kind, occurred in conn.execute(
            "SELECT thread_id, kind, occurred_at FROM audit_auditevent "
            "WHERE thread_id = ANY(%s)",
            [thread_ids],
        ):
            add(thread_id, f"audit {kind}{READ if kind in READS else ''}", occurred)
        for thread_id, step, source, created in conn.execute(
            "SELECT t.thread_id, c.step, c.source, c.created_at "
            "FROM runs_checkpoint c JOIN runs_thread t ON t.id = c.thread_id "
            "WHERE t.thread_id = ANY(%s)",
            [thread_ids],
        ):
            add(thread_id, f"checkpoint step {step} ({source})", created)
        for thread_id, tool, started, finished in conn.execute(
            "SELECT t.thread_id, tc.tool, tc.started_at, tc.finished_at "
            "FROM runs_toolcall tc JOIN runs_thread t ON t.id = tc.thread_id "
            "WHERE t.thread_id = ANY(%s)",
            [thread_ids],
        ):
            add(thread_id, f"tool {tool} started", started)
            add(thread_id, f"tool {tool} finished", finished)
    return marks


def on_timeline(label: str, web_only: bool) -> bool:
    read = label.endswith(READ)
    if web_only:
        return read or label in WEB_EVENTS
    return not read


def phases(sample: dict, marks: list[tuple[str, float]]) -> dict[str, dict]:
    """Seconds per phase ("A → B") of each timeline, for one flow."""
    client = sample["marks"]
    result: dict[str, dict] = {}
    for name, (opens, closes, inside, web_only) in TIMELINES.items():
        start, end = client[opens], client[closes]
        timeline = sorted(
            [
                (label, at)
                for label, at in marks
                if start <= at <= end and on_timeline(label, web_only)
            ]
            + [(label, client[label]) for label in inside if label in client],
            key=lambda mark: mark[1],
        )
        timeline = [(opens, start), *timeline, (closes, end)]
        result[name] = {
            f"{a} → {b}": b_at - a_at
            for (a, a_at), (b, b_at) in zip(timeline, timeline[1:], strict=False)
        }
    return result


def anatomy(database_url: str, samples: list[dict]) -> dict:
    """For each timeline, p50 and n of each phase, in the order of the first
    flow's timeline, and the p50 of the whole."""
    marks = server_marks(database_url, [s["thread_id"] for s in samples])
    per_phase: dict[str, dict[str, list[float]]] = {name: {} for name in TIMELINES}
    for sample in samples:
        for name, durations in phases(sample, marks[sample["thread_id"]]).items():
            for phase, seconds in durations.items():
                per_phase[name].setdefault(phase, []).append(seconds)
    summary: dict = {"flows": len(samples), "timelines": {}}
    for name, (opens, closes, _, _) in TIMELINES.items():
        summary["timelines"][name] = {
            "whole": statistics.median(
                s["marks"][closes] - s["marks"][opens] for s in samples
            ),
            "phases": [
                {"phase": phase, "p50": statistics.median(values), "n": len(values)}
                for phase, values in per_phase[name].items()
            ],
        }
    return summary
