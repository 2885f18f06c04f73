"""Thread content a subscription may ask for (`include_content`): the thread's
values with its run events. Reading them is a decrypted read of the thread,
recorded in the audit trail like any other (`run.output_read`)."""

from __future__ import annotations

from typing import Any

from audit.models import AuditEvent
from audit.services import Actor
from runs import services
from runs.graphs import compile_for, thread_config
from runs.models import Run, Thread
from runs.selectors import jsonable

READER = Actor.system("webhooks")


def run_values(event: AuditEvent) -> tuple[Thread, Any] | None:
    """(thread, its values) for a run event whose thread is still there."""
    if not event.kind.startswith("run.") or not event.run_id:
        return None
    run = (
        Run.objects.select_related("thread__tenant")
        .filter(pk=event.run_id, thread__deleted_at__isnull=True)
        .first()
    )
    if run is None or not run.thread.agent_version:
        return None
    services.run_output_read(run=run, thread=run.thread, actor=READER, how="webhook")
    snapshot = compile_for(run.thread).get_state(thread_config(run.thread))
    return run.thread, jsonable(snapshot.values)
