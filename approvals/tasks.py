"""Celery tasks of approvals: sending its e-mails (approvals.notifications)."""

from __future__ import annotations

import smtplib

from celery import shared_task
from django.conf import settings
from django.core.mail import EmailMessage


@shared_task(
    name="approvals.send_notice",
    ignore_result=True,
    autoretry_for=(smtplib.SMTPException, OSError),
    retry_backoff=30,
    retry_backoff_max=1800,
    max_retries=8,
)
def send_notice(subject: str, body: str, recipient: str) -> None:
    """One message to one person (nobody sees who else was told, and a retry
    while the mail server is down repeats no one else's)."""
    EmailMessage(subject, body, settings.DEFAULT_FROM_EMAIL, [recipient]).send()
