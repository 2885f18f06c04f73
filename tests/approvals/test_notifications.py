"""E-mails about approval requests, sent by a real worker after the change
commits: to the reviewer a request is assigned to, to the roles it is
escalated to, to compliance officers when it expires. Each names the action,
the risk, the thread and the card; none carries the customer's content."""

from __future__ import annotations

import email
from datetime import timedelta
from pathlib import Path

import pytest
import time_machine
from django.conf import settings
from django.core import mail
from django.test import Client
from django.utils import timezone

from approvals.models import ApprovalRequest
from approvals.tasks import send_notice
from retention.jobs import job_run
from runs.models import Thread
from tests.factories import make_member, make_tenant
from tests.retention.helpers import SECRET, make_thread
from tests.workers import wait_for

MAIL_DIR = Path(settings.EMAIL_FILE_PATH)  # where the workers' mail lands
SEPARATOR = "\n" + "-" * 79 + "\n"


def mails_to(address: str) -> list[email.message.Message]:
    """Every message the workers sent to `address` (the file backend writes
    them one after another, separated by a line of dashes)."""
    found = []
    for path in sorted(MAIL_DIR.glob("*.log")):
        for text in path.read_text().split(SEPARATOR):
            if text.strip():
                message = email.message_from_string(text.lstrip("\n"))
                if message["To"] == address:
                    found.append(message)
    return found


def one_mail_to(address: str, subject_part: str) -> email.message.Message:
    def sent():
        return [m for m in mails_to(address) if subject_part in m["Subject"]]

    wait_for(lambda: sent(), timeout=60, what=f"a mail to {address}: {subject_part}")
    (message,) = sent()
    return message


def member_with_mail(tenant, role: str, username: str):
    user = make_member(tenant, role=role, username=username).user
    user.email = f"{username}-{tenant.pk}@example.com"
    user.save(update_fields=["email"])
    return user


def desk(thread_id: str, officer_name: str, reviewer_name: str):
    """A pending request in a tenant of its own; (request, officer, reviewer)."""
    tenant = make_tenant()
    make_thread(tenant, thread_id, steps=1)
    approval = ApprovalRequest.objects.select_related("thread", "tenant").get()
    officer = member_with_mail(tenant, "compliance_officer", officer_name)
    return approval, officer, member_with_mail(tenant, "reviewer", reviewer_name)


def on_the_card(user, approval, button: str, data: dict | None = None) -> None:
    """`user` presses the card's `button` (reassign, escalate)."""
    client = Client()
    client.force_login(user)
    url = f"/admin/approvals/approvalrequest/{approval.pk}/{button}/"
    assert client.post(url, data or {}).status_code == 302


def assert_names_the_request(message, approval: ApprovalRequest) -> str:
    body = message.get_payload()
    for expected in (
        f"Action: {approval.action}",
        f"Risk: {approval.risk}",
        f"Thread: {approval.thread.thread_id}",
        f"/admin/approvals/approvalrequest/{approval.pk}/change/",
    ):
        assert expected in body, (expected, body)
    assert approval.action in message["Subject"]
    assert approval.thread.thread_id in message["Subject"]
    # The payload's note and the thread's messages carry SECRET: never mailed.
    assert SECRET not in message.as_string()
    return body


def test_the_task_sends_one_message_to_its_one_recipient():
    send_notice.run("[Gatehouse] subject", "body", "rita@example.com")
    (sent,) = mail.outbox
    assert sent.to == ["rita@example.com"] and sent.subject == "[Gatehouse] subject"
    assert sent.from_email == settings.DEFAULT_FROM_EMAIL


@pytest.mark.django_db(transaction=True)
@pytest.mark.worker
def test_a_reviewer_is_mailed_when_a_request_is_assigned_to_them(worker):
    approval, officer, rita = desk("case-mail-1", "cora", "rita")
    on_the_card(officer, approval, "reassign", {"assignee": rita.pk})

    message = one_mail_to(rita.email, "Assigned to you")
    body = assert_names_the_request(message, approval)
    assert "cora assigned you" in body
    assert not mails_to(officer.email)  # nobody else is told


@pytest.mark.django_db(transaction=True)
@pytest.mark.worker
def test_roles_are_mailed_along_the_chain_and_officers_when_it_expires(worker):
    tenant = make_tenant()
    reviewer = member_with_mail(tenant, "reviewer", "rex")
    officer = member_with_mail(tenant, "compliance_officer", "olga")
    thread = make_thread(tenant, "case-mail-2", steps=1)
    Thread.objects.filter(pk=thread.pk).update(status=Thread.Status.INTERRUPTED)
    approval = ApprovalRequest.objects.select_related("thread", "tenant").get()
    ApprovalRequest.objects.filter(pk=approval.pk).update(
        due_at=timezone.now() + timedelta(hours=1)
    )
    approval.refresh_from_db()

    def sweep_at(hours: float) -> dict:
        moment = approval.due_at + timedelta(hours=hours)
        with time_machine.travel(moment, tick=False):
            return job_run("escalate_approvals").totals

    assert sweep_at(0.1) == {"step_remind": 1}
    remind = one_mail_to(reviewer.email, "Escalated (remind)")
    assert "escalated to the reviewers" in assert_names_the_request(remind, approval)

    assert sweep_at(4.2) == {"step_escalate": 1}
    escalate = one_mail_to(officer.email, "Escalated (escalate)")
    assert_names_the_request(escalate, approval)

    assert sweep_at(28.3) == {"expired": 1}
    expired = one_mail_to(officer.email, "Expired")
    assert "denied by the system" in assert_names_the_request(expired, approval)
    assert not [m for m in mails_to(reviewer.email) if "Expired" in m["Subject"]]


@pytest.mark.django_db(transaction=True)
@pytest.mark.worker
def test_escalating_by_hand_mails_the_roles_of_the_chains_step(worker):
    approval, officer, reviewer = desk("case-mail-3", "otto", "ria")
    on_the_card(officer, approval, "escalate")
    # Level 1 of the default chain is "remind": the reviewers.
    message = one_mail_to(reviewer.email, "Escalated (remind, by otto)")
    assert "escalated to the reviewers" in assert_names_the_request(message, approval)
