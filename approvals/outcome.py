"""What became of a request once it left the queue: who decided it, when,
after how long, and what the run it resumed did (the reviewer's desk shows it
on a decided card).

The resumed run and any retry after it are the thread's runs created since
the decision. Their side effects come from the ToolCall ledger (what the run
did downstream: a refund's payment id) and a failure from the run's error
text; both are thread ciphertext, so a card that shows them records one audit
event for that read (`run.output_read`, or `run.read` for an error), like
every other decrypted read.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field

from approvals import queue
from approvals.cards import duration_text
from approvals.edits import value_text
from approvals.models import ApprovalRequest
from audit.services import Actor
from runs.crypto import CryptoError, ThreadCipher
from runs.models import Run, ToolCall
from runs.selectors import run_error_text
from runs.services import run_errors_read, run_output_read

# A card lists at most this many runs and side effects since the decision.
SHOWN = 10
RESULT_CHARS = 300


@dataclass
class SideEffect:
    tool: str
    status: str
    result: str = ""


@dataclass
class Aftermath:
    """A settled request, and the runs since its decision."""

    status: str
    decided_at: datetime.datetime | None
    waited: datetime.timedelta | None
    deciders: list[str]
    runs: list[Run] = field(default_factory=list)
    # "succeeded", "failed", "running" (queued or running), "interrupted"
    # (stopped at another gate), "cancelled", or "" when no run was resumed.
    run_state: str = ""
    error: str = ""
    effects: list[SideEffect] = field(default_factory=list)

    @property
    def waited_text(self) -> str:
        return duration_text(self.waited) if self.waited is not None else ""

    @property
    def last_run(self) -> Run | None:
        return self.runs[-1] if self.runs else None


def _run_state(run: Run | None) -> str:
    if run is None:
        return ""
    if run.status in Run.ACTIVE:
        return "running"
    return run.status


def _result_text(call: ToolCall, cipher: ThreadCipher) -> str:
    try:
        result = cipher.decrypt_value(
            call.result, row=("tool-result", call.idempotency_key)
        )
    except CryptoError:
        return "(unreadable)"
    if isinstance(result, dict):
        text = ", ".join(f"{key}={value_text(value)}" for key, value in result.items())
    else:
        text = value_text(result)
    text = " ".join(text.split())
    return text if len(text) <= RESULT_CHARS else text[: RESULT_CHARS - 1] + "…"


def aftermath(*, approval: ApprovalRequest, user) -> Aftermath | None:
    """What became of a settled or closed request, read for `user` (audited
    when it decrypts); None while it is pending."""
    if approval.is_pending:
        return None
    decided_at = approval.decided_at
    result = Aftermath(
        status=approval.status,
        decided_at=decided_at,
        waited=(decided_at - approval.created_at) if decided_at else None,
        deciders=queue.deciders(approval.decisions.all()),
    )
    if decided_at is None or approval.status == ApprovalRequest.Status.CANCELLED:
        return result
    thread = approval.thread
    result.runs = list(
        Run.objects.filter(thread=thread, created_at__gte=decided_at).order_by(
            "created_at"
        )[:SHOWN]
    )
    last = result.last_run
    result.run_state = _run_state(last)
    actor = Actor.user(user)
    if last is not None and last.status == Run.Status.FAILED:
        try:
            result.error = run_error_text(last) or last.error_type
        except CryptoError:
            result.error = f"{last.error_type} (its text cannot be read)"
        else:
            run_errors_read(thread=thread, runs=[last], actor=actor)
        return result
    calls = list(
        ToolCall.objects.filter(thread=thread, started_at__gte=decided_at).order_by(
            "started_at"
        )[:SHOWN]
    )
    cipher = ThreadCipher.for_thread(thread) if calls else None
    for call in calls:
        effect = SideEffect(tool=call.tool, status=call.status)
        if call.status == ToolCall.Status.SUCCEEDED and call.result is not None:
            effect.result = _result_text(call, cipher)
        elif call.error_type:
            effect.result = call.error_type
        result.effects.append(effect)
    if any(call.result is not None for call in calls):
        run_output_read(
            run=last or approval.run, thread=thread, actor=actor, how="reviewer's desk"
        )
    return result
