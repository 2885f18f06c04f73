"""Side effects that happen once, whatever the retries: the ToolCall ledger.

Durable execution is at-least-once: a step that crashed after its side effect
ran, but before its checkpoint landed, runs again. A node therefore wraps every
side effect in `side_effect()`, which

1. derives an idempotency key that is the same on every retry of the same step:
   a digest of tenant, thread, checkpoint namespace and id, task id, tool name
   and the call's index within the step;
2. records each attempt as `started` in the ToolCall ledger before calling, so
   the crash window is visible;
3. hands the key to the downstream system (which deduplicates on it, as a
   payment API does), within the attempt's timeout if there is one;
4. records the attempt's outcome: `succeeded` with the result, encrypted, or
   `failed` / `timed_out`; a failure its retry policy allows is attempted
   again, after the policy's backoff, with the same key;
5. returns the recorded result, without calling again, when the ledger already
   holds a success for that key.

A node that calls the same tool twice in one step passes distinct
`call_index` values; indices must be the same on every retry (so: no counters
that depend on what happened before the crash).

A call may name its compensation (`compensate=`): what undoes it if the run
later fails for good. The ledger keeps what the compensation needs (the
arguments, encrypted, and the function's import path); runs.compensation runs
it, through this same ledger, with a key of its own.
"""

from __future__ import annotations

import contextvars
import hashlib
import importlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import router, transaction
from django.utils import timezone

from audit import events
from audit.redaction import describe
from audit.services import Actor, record, record_with_write
from runs import thread_connections
from runs.context import current_step, step_key
from runs.crypto import ThreadCipher
from runs.fixed_queries import (
    insert_statement,
    row_gone,
    save_new,
    update_statement,
)
from runs.models import Thread, ToolCall


@dataclass(frozen=True)
class RetryPolicy:
    """How many times a side effect is attempted, and how long to wait between.

    The wait before attempt n (n >= 2) is `backoff * multiplier ** (n - 2)`
    seconds, at most `max_backoff`. Only exceptions that are instances of
    `retry_on` are attempted again; any other fails the step at once. The
    worker waits inside the step (the run keeps its lease): policies are for
    seconds, not hours.
    """

    attempts: int = 3
    backoff: float = 1.0
    multiplier: float = 2.0
    max_backoff: float = 30.0
    retry_on: tuple[type[BaseException], ...] = (Exception,)

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("a retry policy needs at least one attempt")
        if self.backoff < 0 or self.max_backoff < 0 or self.multiplier < 1:
            raise ValueError(
                "backoff and max_backoff cannot be negative, nor multiplier below 1"
            )

    def wait_before(self, attempt: int) -> float:
        return min(self.backoff * self.multiplier ** (attempt - 2), self.max_backoff)


# One attempt per execution of the step: a failure fails the step.
ONCE = RetryPolicy(attempts=1)


class ActivityTimedOut(TimeoutError):
    """An attempt got no answer within its timeout. The call may still land
    downstream: the next attempt carries the same key."""


class ActivityFailed(Exception):
    """A side effect failed for good: its error was not retryable, or it ran
    out of attempts. The last attempt's exception is the `__cause__`."""

    @classmethod
    def of(
        cls, tool: str, attempt: int, policy: RetryPolicy, error: Exception
    ) -> ActivityFailed:
        why = (
            f"after {attempt} attempt(s)"
            if isinstance(error, policy.retry_on)
            else f"on attempt {attempt}, not retryable"
        )
        return cls(f"{tool} failed {why}: {type(error).__name__}: {error}")


def args_digest(args: dict[str, Any]) -> str:
    material = json.dumps(args, sort_keys=True, default=str)
    return hashlib.sha256(material.encode()).hexdigest()


def idempotency_key(*, tool: str, call_index: int = 0) -> str:
    """The key of this call in the current step; stable across retries."""
    return step_key("gatehouse-tool-call", tool, call_index)


def function_path(function: Callable) -> str:
    """`module:qualname` of a function that a worker can import again: the
    worker that undoes a step may not be the one that did it."""
    path = f"{function.__module__}:{function.__qualname__}"
    try:
        found = import_function(path)
    except (ImportError, AttributeError):
        found = None
    if found is not function:
        raise TypeError(
            f"{path} cannot be imported by name: a compensation must be a function "
            "defined at the top level of a module (not a lambda or a closure)"
        )
    return path


def import_function(path: str) -> Callable:
    module, _, name = path.partition(":")
    target: Any = importlib.import_module(module)
    for part in name.split("."):
        target = getattr(target, part)
    return target


def _call_within(perform: Callable[[str], Any], key: str, timeout: float | None):
    """`perform(key)`, given up on after `timeout` seconds.

    A thread cannot be stopped from outside, so a timed-out call goes on in
    the background; whatever it does lands under the same key as the next
    attempt, which the downstream system deduplicates.
    """
    if timeout is None:
        return perform(key)
    context = contextvars.copy_context()  # the run context LangGraph set
    outcome: dict[str, Any] = {}
    done = threading.Event()

    def attempt() -> None:
        thread_connections.bind()
        try:
            outcome["result"] = context.run(perform, key)
        except BaseException as exc:  # noqa: BLE001  handed to the caller
            outcome["error"] = exc
        finally:
            thread_connections.release()  # this thread's, for the next one
            done.set()

    threading.Thread(target=attempt, name=f"side-effect-{key[:8]}", daemon=True).start()
    if not done.wait(timeout):
        raise ActivityTimedOut(f"no answer within {timeout:g}s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


class Ledger:
    """One call's row in the ToolCall ledger, attempted under a retry policy."""

    def __init__(
        self,
        *,
        thread: Thread,
        run_id: str,
        key: str,
        tool: str,
        audit: dict[str, Any],
        succeeded_kind: events.EventKind = events.TOOL_CALL_SUCCEEDED,
    ) -> None:
        self.thread, self.run_id, self.key, self.tool = thread, run_id, key, tool
        self.cipher = ThreadCipher.for_thread(thread)
        self.audit = {"tool": tool, "key": key[:16], **audit}
        self.succeeded_kind = succeeded_kind
        self.row: ToolCall | None = None

    def seal(self, purpose: str, value: Any) -> bytes:
        return self.cipher.encrypt_value(value, row=(purpose, self.key))

    def unseal(self, purpose: str, value: bytes) -> Any:
        return self.cipher.decrypt_value(value, row=(purpose, self.key))

    def call(
        self,
        perform: Callable[[str], Any],
        *,
        retry: RetryPolicy = ONCE,
        timeout: float | None = None,
        **fields: Any,
    ) -> Any:
        """The recorded result, or `perform(key)`'s, attempted per `retry`;
        `fields` are the row's own columns, written when it is created."""
        attempt = 0
        while True:
            attempt += 1
            done, result = self._begin(fields)
            if done:
                return result
            try:
                result = _call_within(perform, self.key, timeout)
            except Exception as exc:
                retrying = attempt < retry.attempts and isinstance(exc, retry.retry_on)
                wait = retry.wait_before(attempt + 1) if retrying else None
                self._failed(exc, wait)
                if wait is None:
                    raise ActivityFailed.of(self.tool, attempt, retry, exc) from exc
                time.sleep(wait)
                continue
            self._succeeded(result)
            return result

    def _event_fields(self, kind: events.EventKind, **data: Any) -> dict[str, Any]:
        return {
            "tenant": self.thread.tenant,
            "kind": kind,
            "actor": Actor.agent(self.thread.agent_name),
            "thread_id": self.thread.thread_id,
            "run_id": self.run_id,
            "action": self.tool,
            "data": {**self.audit, **data},
        }

    def _event(self, kind: events.EventKind, **data: Any) -> None:
        record(**self._event_fields(kind, **data))

    def _begin(self, fields: dict[str, Any]) -> tuple[bool, Any]:
        """Record a new attempt `started`; (True, result) if a success is
        recorded already."""
        now = timezone.now()
        if self.row is None:
            row = ToolCall(
                tenant=self.thread.tenant,
                thread=self.thread,
                idempotency_key=self.key,
                tool=self.tool,
                status=ToolCall.Status.STARTED,
                run_id=self.run_id,
                attempt_log=[_attempt_entry(1, now)],
                started_at=now,
                **fields,
            )
            if _insert_new(
                row, self._event_fields(events.TOOL_CALL_STARTED, attempt=1)
            ):
                self.row = row
                return False, None
        with transaction.atomic():
            if self.row is None:
                self.row = ToolCall.objects.select_for_update(no_key=True).get(
                    thread=self.thread, idempotency_key=self.key
                )
                if self.row.status == ToolCall.Status.SUCCEEDED:
                    return True, self.unseal("tool-result", self.row.result)
            # Started before and never finished (the crash window: a worker
            # lost mid-call), or failed: call again with the same key.
            row = self.row
            row.attempts += 1
            row.status, row.finished_at = ToolCall.Status.STARTED, None
            row.attempt_log = [
                {**entry, "outcome": "lost"} if entry["outcome"] == "started" else entry
                for entry in row.attempt_log
            ] + [_attempt_entry(row.attempts, now)]
            row.save(update_fields=["attempts", "status", "finished_at", "attempt_log"])
            self._event(events.TOOL_CALL_STARTED, attempt=row.attempts)
        return False, None

    def _finish_attempt(self, outcome: str, error_type: str = "") -> None:
        row = self.row
        row.finished_at = timezone.now()
        last = {**row.attempt_log[-1], "outcome": outcome, "ended": row.finished_at}
        if error_type:
            last["error_type"] = error_type
        row.attempt_log = [*row.attempt_log[:-1], _jsonable(last)]

    def _failed(self, error: Exception, wait: float | None) -> None:
        row = self.row
        timed_out = isinstance(error, ActivityTimedOut)
        error_type = type(error).__name__[:200]
        self._finish_attempt("timed_out" if timed_out else "failed", error_type)
        row.status, row.error_type = ToolCall.Status.FAILED, error_type
        self._save_recorded(
            ("status", "error_type", "finished_at", "attempt_log"),
            self._event_fields(
                events.TOOL_CALL_FAILED,
                attempt=row.attempts,
                error_type=error_type,
                retry_in=wait,
                then="giving up" if wait is None else f"retrying in {wait:g}s",
            ),
        )

    def _succeeded(self, result: Any) -> None:
        row = self.row
        self._finish_attempt("succeeded")
        row.status, row.error_type = ToolCall.Status.SUCCEEDED, ""
        row.result = self.seal("tool-result", result)
        self._save_recorded(
            ("status", "error_type", "result", "finished_at", "attempt_log"),
            self._event_fields(self.succeeded_kind, attempt=self.row.attempts),
        )

    def _save_recorded(self, fields: tuple[str, ...], event: dict[str, Any]) -> None:
        """Save the row's `fields` and record `event`, atomically: one
        statement (audit.services.record_with_write) where it can be."""
        row = self.row
        statement = update_statement(row, fields)
        if statement is None:
            with transaction.atomic():
                row.save(update_fields=fields)
                record(**event)
            return
        recorded, _ = record_with_write(statement, **event)
        if recorded is None:
            raise row_gone()


def _insert_new(row: ToolCall, event: dict[str, Any]) -> bool:
    """Insert the ledger row, with `event`, unless its key is there already
    (runs.fixed_queries.insert_statement): False if it is, and then
    nothing is recorded. One statement for the row and its event, where a
    transaction of their own would cost its BEGIN and COMMIT too."""
    using = router.db_for_write(ToolCall)
    statement = insert_statement(row, ignore_conflicts=True, using=using)
    if statement is None:  # only Model.save may insert it
        with transaction.atomic(using=using):
            if not save_new(row, ignore_conflicts=True, using=using):
                return False
            record(**event)
        return True
    _, inserted = record_with_write(statement, **event)
    if not inserted:
        return False
    row.pk = inserted[0][0]
    row._state.adding, row._state.db = False, using
    return True


def _attempt_entry(number: int, at) -> dict[str, Any]:
    return _jsonable({"attempt": number, "outcome": "started", "started": at})


def _jsonable(entry: dict[str, Any]) -> dict[str, Any]:
    return {
        k: v.isoformat() if hasattr(v, "isoformat") else v for k, v in entry.items()
    }


def side_effect(
    tool: str,
    args: dict[str, Any],
    perform: Callable[[str], Any],
    *,
    call_index: int = 0,
    safe_keys: frozenset[str] = frozenset(),
    retry: RetryPolicy = ONCE,
    timeout: float | None = None,
    compensate: Callable[[dict[str, Any], Any, str], Any] | None = None,
) -> Any:
    """Run `perform(idempotency_key)` until it succeeds once per step; see the
    module doc.

    `safe_keys` names the arguments that may appear in clear in the audit
    trail (an order id, an amount); the others appear only as digests.
    `retry` and `timeout` (seconds, per attempt) say how hard to try; a
    failure for good raises `ActivityFailed`. `compensate(args, result, key)`,
    a module-level function, undoes the call if the run fails later
    (runs.compensation).
    """
    context, _ = current_step()
    thread_connections.bind()  # a node may run on one of LangGraph's threads
    key = idempotency_key(tool=tool, call_index=call_index)
    thread = context.thread_row()
    ledger = Ledger(
        thread=thread,
        run_id=context.run_id,
        key=key,
        tool=tool,
        audit={"args": describe(args, safe_keys=safe_keys)},
    )
    fields: dict[str, Any] = {"args_digest": args_digest(args)}
    if compensate is not None:
        fields["compensation"] = function_path(compensate)
        fields["args"] = ledger.seal("tool-args", args)
    return ledger.call(perform, retry=retry, timeout=timeout, **fields)
