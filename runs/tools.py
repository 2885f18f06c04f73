"""Side effects that happen once, whatever the retries: the ToolCall ledger.

Durable execution is at-least-once: a step that crashed after its side effect
ran, but before its checkpoint landed, runs again. A node therefore wraps every
side effect in `side_effect()`, which

1. derives an idempotency key that is the same on every retry of the same step:
   a digest of tenant, thread, checkpoint namespace and id, task id, tool name
   and the call's index within the step;
2. records the call as `started` in the ToolCall ledger before calling, so the
   crash window is visible;
3. hands the key to the downstream system (which deduplicates on it, as a
   payment API does);
4. records the call as `succeeded` with its result, encrypted, afterwards;
5. returns the recorded result, without calling again, when the ledger already
   holds a success for that key.

A node that calls the same tool twice in one step passes distinct
`call_index` values; indices must be the same on every retry (so: no counters
that depend on what happened before the crash).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from audit import events
from audit.redaction import describe
from audit.services import Actor, record
from runs.context import current_step, step_key
from runs.crypto import ThreadCipher
from runs.models import Thread, ToolCall


def args_digest(args: dict[str, Any]) -> str:
    material = json.dumps(args, sort_keys=True, default=str)
    return hashlib.sha256(material.encode()).hexdigest()


def idempotency_key(*, tool: str, call_index: int = 0) -> str:
    """The key of this call in the current step; stable across retries."""
    return step_key("gatehouse-tool-call", tool, call_index)


def side_effect(
    tool: str,
    args: dict[str, Any],
    perform: Callable[[str], Any],
    *,
    call_index: int = 0,
    safe_keys: frozenset[str] = frozenset(),
) -> Any:
    """Run `perform(idempotency_key)` at most once per step; see the module doc.

    `safe_keys` names the arguments that may appear in clear in the audit
    trail (an order id, an amount); the others appear only as digests.
    """
    context, _ = current_step()
    key = idempotency_key(tool=tool, call_index=call_index)
    thread = Thread.objects.select_related("tenant").get(pk=context.thread_pk)
    cipher = ThreadCipher.for_thread(thread)
    row = ("tool-result", key)
    audit_args = describe(args, safe_keys=safe_keys)

    with transaction.atomic():
        try:
            with transaction.atomic():
                call = ToolCall.objects.create(
                    tenant=thread.tenant,
                    thread=thread,
                    idempotency_key=key,
                    tool=tool,
                    args_digest=args_digest(args),
                    status=ToolCall.Status.STARTED,
                )
        except IntegrityError:
            call = ToolCall.objects.select_for_update().get(
                thread=thread, idempotency_key=key
            )
            if call.status == ToolCall.Status.SUCCEEDED:
                return cipher.decrypt_value(call.result, row=row)
            # Started before and never finished (the crash window), or failed:
            # call again with the same key; the downstream system deduplicates.
            ToolCall.objects.filter(pk=call.pk).update(
                attempts=F("attempts") + 1, status=ToolCall.Status.STARTED
            )
        record(
            tenant=thread.tenant,
            kind=events.TOOL_CALL_STARTED,
            actor=Actor.agent(thread.agent_name),
            thread_id=thread.thread_id,
            run_id=context.run_id,
            action=tool,
            data={"tool": tool, "key": key[:16], "args": audit_args},
        )

    try:
        result = perform(key)
    except Exception as exc:
        ToolCall.objects.filter(pk=call.pk).update(
            status=ToolCall.Status.FAILED,
            error_type=type(exc).__name__[:200],
            finished_at=timezone.now(),
        )
        raise

    with transaction.atomic():
        ToolCall.objects.filter(pk=call.pk).update(
            status=ToolCall.Status.SUCCEEDED,
            result=cipher.encrypt_value(result, row=row),
            finished_at=timezone.now(),
        )
        record(
            tenant=thread.tenant,
            kind=events.TOOL_CALL_SUCCEEDED,
            actor=Actor.agent(thread.agent_name),
            thread_id=thread.thread_id,
            run_id=context.run_id,
            action=tool,
            data={"tool": tool, "key": key[:16], "args": audit_args},
        )
    return result
