"""Celery tasks of approvals: sending its e-mails (approvals.notifications)."""

from __future__ import annotations

import smtplib

from celery import shared_task

from approvals.models import ApprovalNotice
from approvals.notifications import NoticeGivenUp, mail, send_owed


@shared_task(
    name="approvals.send_notice",
    ignore_result=True,
    autoretry_for=(smtplib.SMTPException, OSError),
    retry_backoff=30,
    retry_backoff_max=1800,
    max_retries=8,
)
def send_notice(*args) -> None:
    """One message to one person (nobody sees who else was told, and a retry
    while the mail server is down repeats no one else's): the notice owed by
    that id, unless it is sent already or being sent (by a sweep)."""
    if len(args) == 3:
        # (subject, body, recipient): queued by a release that owed nothing
        # in the database, before the upgrade.
        mail(*args)
        return
    (notice_id,) = args
    try:
        send_owed(ApprovalNotice.objects.filter(pk=notice_id))
    except NoticeGivenUp:
        return  # refused for good: logged, nothing to retry
