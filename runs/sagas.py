"""Which calls make up a thread's saga (what a failed run must undo).

A saga is the compensable calls a thread made since its last successful run,
so the runs that resume a thread after its approvals are one saga. Closing a
failed thread (runs.services.thread_close) ends its saga too: the calls whose
undoing never succeeded are settled, left as they are by a person's decision,
and no later run's compensation (runs.compensation) considers them.
"""

from __future__ import annotations

from django.db.models import Exists, OuterRef
from django.utils import timezone

from runs.models import Run, Thread, ToolCall


def saga_calls(thread: Thread) -> list[ToolCall]:
    """The thread's compensable calls since its last successful run, newest
    first, each annotated `undone`; settled calls are no longer any saga's."""
    runs = thread.runs.all()
    last_success = (
        thread.runs.filter(status=Run.Status.SUCCEEDED)
        .order_by("-created_at")
        .values_list("created_at", flat=True)
        .first()
    )
    if last_success is not None:
        runs = runs.filter(created_at__gt=last_success)
    run_ids = [str(pk) for pk in runs.values_list("pk", flat=True)]
    undone = ToolCall.objects.filter(
        compensates=OuterRef("pk"), status=ToolCall.Status.SUCCEEDED
    )
    return list(
        ToolCall.objects.filter(
            thread=thread,
            run_id__in=run_ids,
            status=ToolCall.Status.SUCCEEDED,
            compensates__isnull=True,
            settled_at__isnull=True,
        )
        .exclude(compensation="")
        .annotate(undone=Exists(undone))
        .order_by("-pk")
    )


def settle(thread: Thread) -> list[ToolCall]:
    """Settle the saga's calls that were not undone, newest first: a person
    closed the failed thread instead of retrying its undoing, so they stand
    as done. Call it in the closing transaction, which audits them."""
    outstanding = [call for call in saga_calls(thread) if not call.undone]
    ToolCall.objects.filter(pk__in=[call.pk for call in outstanding]).update(
        settled_at=timezone.now()
    )
    return outstanding
