"""approvals reacts to runs through signals, so that runs never imports it."""

from django.dispatch import receiver

from approvals.services import approval_requests_open
from runs.signals import run_interrupted


@receiver(run_interrupted, dispatch_uid="approvals.open_requests")
def open_approval_requests(sender, *, run, interrupts, **kwargs) -> None:
    approval_requests_open(run=run, interrupts=interrupts)
