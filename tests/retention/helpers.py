"""Setup for the retention tests: threads with real, encrypted content."""

from __future__ import annotations

import uuid

from django.db import connection
from langgraph.checkpoint.base import empty_checkpoint

from approvals.models import ApprovalRequest
from audit.services import Actor
from runs.checkpointer import DjangoSaver
from runs.crypto import ThreadCipher
from runs.models import Checkpoint, Run, Thread, ToolCall
from runs.services import thread_create

TESTS = Actor.system("tests")
# What a customer wrote; it must never be found in clear anywhere after a
# deletion, and never in the audit trail at all.
SECRET = "jane-doe-private-note"


def write_checkpoints(thread: Thread, steps: int, *, text: str = SECRET) -> list[str]:
    """`steps` checkpoints (each with a new message blob and two writes); ids."""
    saver = DjangoSaver(tenant=thread.tenant)
    config = {"configurable": {"thread_id": thread.thread_id, "checkpoint_ns": ""}}
    messages: list[str] = []
    versions: dict[str, str] = {}
    ids = []
    for step in range(steps):
        messages = [*messages, f"{text} #{step} " + "x" * 1100]
        new = {
            "messages": saver.get_next_version(versions.get("messages"), None),
            "step": saver.get_next_version(versions.get("step"), None),
        }
        versions.update(new)
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"messages": messages, "step": step}
        checkpoint["channel_versions"] = dict(versions)
        config = saver.put(config, checkpoint, {"source": "loop", "step": step}, new)
        saver.put_writes(
            config, [("messages", [f"{text} write {step}"]), ("step", step)], str(step)
        )
        ids.append(checkpoint["id"])
    return ids


def make_thread(
    tenant,
    thread_id: str | None = None,
    *,
    steps: int = 3,
    subject: str | None = None,
    agent: str = "echo",
    with_content: bool = True,
) -> Thread:
    """A thread with checkpoints, a run with an input, a tool result and a
    pending approval, all encrypted under the thread's key."""
    thread = thread_create(
        tenant=tenant,
        agent=agent,
        actor=TESTS,
        thread_id=thread_id or f"t-{uuid.uuid4().hex[:8]}",
        metadata={"subject": subject} if subject else None,
    )
    Thread.objects.filter(pk=thread.pk).update(agent_version="1")
    thread.refresh_from_db()
    if steps:
        write_checkpoints(thread, steps)
    if with_content:
        add_content(thread)
    return thread


def add_content(thread: Thread) -> tuple[Run, ApprovalRequest]:
    cipher = ThreadCipher.for_thread(thread)
    run = Run(
        tenant=thread.tenant,
        thread=thread,
        kind=Run.Kind.START,
        agent_version="1",
        status=Run.Status.INTERRUPTED,
    )
    run.input = cipher.encrypt_value({"text": SECRET}, row=("run-input", str(run.id)))
    run.save()
    ToolCall.objects.create(
        tenant=thread.tenant,
        thread=thread,
        idempotency_key=uuid.uuid4().hex,
        tool="outbox.send",
        args_digest="0" * 64,
        status=ToolCall.Status.SUCCEEDED,
        result=cipher.encrypt_value({"body": SECRET}, row=("tool-result", "k")),
    )
    approval = ApprovalRequest(
        tenant=thread.tenant,
        thread=thread,
        run=run,
        interrupt_id=uuid.uuid4().hex,
        action="do_one",
        due_at=run.created_at,
    )
    approval.payload = cipher.encrypt_value(
        {"action": "do_one", "args": {"note": SECRET}},
        row=("approval-payload", str(approval.id)),
    )
    approval.save()
    return run, approval


def content_rows(thread: Thread) -> dict[str, int]:
    from runs.models import ChannelBlob, PendingWrite

    return {
        "checkpoints": Checkpoint.objects.filter(thread=thread).count(),
        "channel_blobs": ChannelBlob.objects.filter(thread=thread).count(),
        "pending_writes": PendingWrite.objects.filter(thread=thread).count(),
    }


def tables_containing(text: str) -> list[str]:
    """Every table with a row whose text (bytea as hex) contains `text`."""
    needle_hex = text.encode().hex()
    found = []
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' "
            "ORDER BY tablename"
        )
        for (table,) in cursor.fetchall():
            cursor.execute(
                f'SELECT count(*) FROM "{table}" t WHERE t::text LIKE %s '
                "OR t::text LIKE %s",
                [f"%{text}%", f"%{needle_hex}%"],
            )
            if cursor.fetchone()[0]:
                found.append(table)
    return found
