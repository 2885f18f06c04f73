"""approvals reacts to runs through signals, so that runs never imports it."""

from django.dispatch import receiver

from approvals.services import (
    approval_interrupts_move,
    approval_requests_open,
    approvals_close_for_thread,
)
from runs.signals import interrupts_moved, run_interrupted, thread_closed


@receiver(run_interrupted, dispatch_uid="approvals.open_requests")
def open_approval_requests(sender, *, run, interrupts, **kwargs) -> None:
    approval_requests_open(run=run, interrupts=interrupts)


@receiver(thread_closed, dispatch_uid="approvals.close_requests")
def close_approval_requests(sender, *, thread, actor, reason, **kwargs) -> None:
    approvals_close_for_thread(thread=thread, actor=actor, reason=reason)


@receiver(interrupts_moved, dispatch_uid="approvals.move_interrupts")
def move_approval_requests(sender, *, thread, moved, **kwargs) -> None:
    approval_interrupts_move(thread=thread, moved=moved)
