"""Approval e-mails are owed in the database (approvals.models.ApprovalNotice)
and sent by their task or, once older than NOTICE_GRACE, by the approvals
sweep: a notice whose message the broker never took is still sent, once; one
sent is never sent again; two senders at once send one; a send the mail
server refuses stays owed. The mail backend is Django's locmem outbox (and a
slow or failing one of this module's); Postgres and Redis are real."""

from __future__ import annotations

import smtplib
import threading
from datetime import timedelta

import pytest
import time_machine
from django.core import mail
from django.core.mail.backends.locmem import EmailBackend as LocmemBackend
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from approvals.models import ApprovalNotice, ApprovalRequest
from approvals.notifications import NOTICE_GRACE, NOTICE_MAX_AGE, send_owed
from approvals.tasks import send_notice
from audit.services import Actor
from retention.jobs import job_run
from runs.models import Membership, Thread
from runs.services import membership_remove, membership_set
from tests.approvals.test_notifications import desk, on_the_card
from tests.runs.test_outages import broker_unreachable

pytestmark = pytest.mark.django_db(transaction=True)

HERE = "tests.approvals.test_notice_recovery"


def sweep_after(minutes: float) -> dict:
    """The approvals sweep (beat's retention.escalate_approvals), `minutes`
    from now."""
    with time_machine.travel(timezone.now() + timedelta(minutes=minutes), tick=False):
        return dict(job_run("escalate_approvals").totals)


def assigned_while_the_broker_is_down(case: str, stored_as: str = ""):
    """A request assigned to a reviewer while no message can be sent: its
    notice is owed and its task never runs. (approval, reviewer) `stored_as`:
    the thread's id as an older release may have stored it."""
    approval, officer, rita = desk(case, f"cora-{case}", f"rita-{case}")
    if stored_as:
        Thread.objects.filter(pk=approval.thread_id).update(thread_id=stored_as)
    # Waiting on the request, as a run does (else the sweep closes it), and
    # due in days: the sweep's only work here is the notice.
    Thread.objects.filter(pk=approval.thread_id).update(
        status=Thread.Status.INTERRUPTED
    )
    ApprovalRequest.objects.filter(pk=approval.pk).update(
        due_at=timezone.now() + timedelta(days=2)
    )
    with broker_unreachable():
        on_the_card(officer, approval, "reassign", {"assignee": rita.pk})
    return approval, rita


def test_a_notice_whose_task_never_ran_is_sent_by_the_sweep_exactly_once():
    approval, rita = assigned_while_the_broker_is_down("rec-1")
    (owed,) = ApprovalNotice.objects.all()
    assert owed.recipient == rita.email and owed.request_id == approval.pk
    assert not mail.outbox

    # Within the grace the task may still be on its way: the sweep leaves it.
    assert "notices_sent" not in sweep_after(NOTICE_GRACE.total_seconds() / 60 - 1)
    assert not mail.outbox

    assert sweep_after(NOTICE_GRACE.total_seconds() / 60 + 1) == {"notices_sent": 1}
    (sent,) = mail.outbox
    assert sent.to == [rita.email] and "Assigned to you" in sent.subject
    assert f"/admin/approvals/approvalrequest/{approval.pk}/change/" in sent.body
    assert not ApprovalNotice.objects.exists()

    # Sent is sent: neither a later sweep nor the task's message, arriving
    # late, sends it again.
    assert "notices_sent" not in sweep_after(60)
    send_notice.run(owed.pk)
    assert len(mail.outbox) == 1


def test_a_notice_its_task_sent_is_not_sent_again_by_the_sweep():
    _, rita = assigned_while_the_broker_is_down("rec-2")
    (owed,) = ApprovalNotice.objects.all()
    send_notice.run(owed.pk)  # the task, as a worker runs it
    assert [m.to for m in mail.outbox] == [[rita.email]]
    assert not ApprovalNotice.objects.exists()

    assert "notices_sent" not in sweep_after(NOTICE_GRACE.total_seconds() / 60 + 1)
    assert len(mail.outbox) == 1


class FailingBackend(LocmemBackend):
    """A mail server that is down."""

    def send_messages(self, messages):
        raise smtplib.SMTPServerDisconnected("down")


def test_a_notice_the_mail_server_refuses_stays_owed_until_it_is_sent():
    _, rita = assigned_while_the_broker_is_down("rec-3")
    (owed,) = ApprovalNotice.objects.all()
    with override_settings(EMAIL_BACKEND=f"{HERE}.FailingBackend"):
        with pytest.raises(smtplib.SMTPServerDisconnected):
            send_notice.run(owed.pk)  # the task fails: Celery retries it
        assert sweep_after(NOTICE_GRACE.total_seconds() / 60 + 1) == {"errors": 1}
    assert ApprovalNotice.objects.filter(pk=owed.pk).exists()
    assert not mail.outbox

    assert sweep_after(NOTICE_GRACE.total_seconds() / 60 + 6) == {"notices_sent": 1}
    assert [m.to for m in mail.outbox] == [[rita.email]]


class HeldBackend(LocmemBackend):
    """A mail server that takes its time: the send waits for `release`."""

    entered = threading.Event()
    release = threading.Event()

    def send_messages(self, messages):
        HeldBackend.entered.set()
        assert HeldBackend.release.wait(30)
        return super().send_messages(messages)


def test_a_notice_being_sent_is_left_alone_by_a_sweep_at_the_same_time():
    """The task (or another sweep) holds the notice mid-send: a sweep then
    passes it by, and once that send commits, nothing is owed: one mail."""
    _, rita = assigned_while_the_broker_is_down("rec-4")
    (owed,) = ApprovalNotice.objects.all()
    HeldBackend.entered.clear()
    HeldBackend.release.clear()
    sent = []

    def first_sender():
        try:
            sent.append(send_owed(ApprovalNotice.objects.filter(pk=owed.pk)))
        finally:
            connection.close()

    with override_settings(EMAIL_BACKEND=f"{HERE}.HeldBackend"):
        sender = threading.Thread(target=first_sender)
        sender.start()
        try:
            assert HeldBackend.entered.wait(30)
            # The second sender: the sweep, while the first is mid-send.
            totals = sweep_after(NOTICE_GRACE.total_seconds() / 60 + 1)
        finally:
            HeldBackend.release.set()
            sender.join(30)
    assert "notices_sent" not in totals
    assert [row.pk for row in sent] == [owed.pk]
    assert [m.to for m in mail.outbox] == [[rita.email]]
    assert not ApprovalNotice.objects.exists()
    assert "notices_sent" not in sweep_after(NOTICE_GRACE.total_seconds() / 60 + 2)
    assert len(mail.outbox) == 1


class RefusingBackend(LocmemBackend):
    """A mail server that refuses the recipient for good (550)."""

    def send_messages(self, messages):
        raise smtplib.SMTPRecipientsRefused(
            {m.to[0]: (550, b"5.1.1 no such user") for m in messages}
        )


def test_a_notice_refused_for_good_is_given_up_not_retried(caplog):
    _, rita = assigned_while_the_broker_is_down("rec-5")
    (owed,) = ApprovalNotice.objects.all()
    with override_settings(EMAIL_BACKEND=f"{HERE}.RefusingBackend"):
        send_notice.run(owed.pk)  # no exception: nothing for Celery to retry
        assert not ApprovalNotice.objects.exists()
        assert sweep_after(NOTICE_GRACE.total_seconds() / 60 + 1) == {}
    assert f"notice {owed.pk} of approval {owed.request_id}" in caplog.text
    assert rita.email not in caplog.text
    assert not mail.outbox


def test_a_notice_the_sweep_finds_refused_for_good_is_given_up():
    assigned_while_the_broker_is_down("rec-6")
    with override_settings(EMAIL_BACKEND=f"{HERE}.RefusingBackend"):
        minutes = NOTICE_GRACE.total_seconds() / 60 + 1
        assert sweep_after(minutes) == {"notices_given_up": 1}
        assert sweep_after(minutes + 5) == {}
    assert not ApprovalNotice.objects.exists() and not mail.outbox


def test_a_notice_owed_past_its_age_is_given_up_by_the_sweep():
    # The mail server down for over a day: the sweep stops trying.
    assigned_while_the_broker_is_down("rec-7")
    with override_settings(EMAIL_BACKEND=f"{HERE}.FailingBackend"):
        assert sweep_after(60) == {"errors": 1}
        minutes = NOTICE_MAX_AGE.total_seconds() / 60 + 1
        assert sweep_after(minutes) == {"notices_given_up": 1}
    assert not ApprovalNotice.objects.exists() and not mail.outbox


def test_a_removed_reviewers_owed_mail_goes_with_their_membership():
    """A reviewer removed from the tenant was mailed 16 minutes later by the
    sweep (membership_remove left the notice): it goes with the membership."""
    approval, rita = assigned_while_the_broker_is_down("rec-8")
    (owed,) = ApprovalNotice.objects.all()
    assert owed.user_id == rita.pk and owed.roles == ["compliance_officer", "reviewer"]
    membership = Membership.objects.get(user=rita, tenant=approval.tenant)
    membership_remove(membership=membership, actor=Actor.system("tests"))
    assert not ApprovalNotice.objects.exists()
    assert sweep_after(NOTICE_GRACE.total_seconds() / 60 + 1) == {}
    send_notice.run(owed.pk)
    assert not mail.outbox


def test_a_deactivated_reviewers_owed_mail_is_dropped():
    _, rita = assigned_while_the_broker_is_down("rec-9")
    rita.is_active = False
    rita.save(update_fields=["is_active"])
    assert not ApprovalNotice.objects.exists()
    assert sweep_after(NOTICE_GRACE.total_seconds() / 60 + 1) == {}
    assert not mail.outbox


def test_a_notice_is_sent_only_to_a_member_still_in_a_role_it_is_for(caplog):
    """Checked at send time too, whatever changed the membership (a bulk
    update sends no signal): another role, no membership, another address,
    a notice owed before recipients were kept (by address)."""
    approval, rita = assigned_while_the_broker_is_down("rec-10")
    (owed,) = ApprovalNotice.objects.all()
    memberships = Membership.objects.filter(user=rita, tenant=approval.tenant)
    memberships.update(role="auditor")
    send_notice.run(owed.pk)  # given up, not retried
    assert not mail.outbox and not ApprovalNotice.objects.exists()
    assert f"notice {owed.pk} of approval {approval.pk}" in caplog.text
    assert rita.email not in caplog.text

    memberships.update(role="reviewer")
    for changed in (
        {"recipient": "someone-else@example.com"},
        {"user": None, "roles": [], "recipient": "nobody@example.com"},
    ):
        owed.pk = None
        for name, value in {"user": rita, "recipient": rita.email, **changed}.items():
            setattr(owed, name, value)
        owed.save()
        send_notice.run(owed.pk)
        assert not mail.outbox and not ApprovalNotice.objects.exists()
    # A notice owed before recipients were kept, to a member's address: sent.
    owed.pk, owed.user, owed.roles, owed.recipient = None, None, [], rita.email
    owed.save()
    send_notice.run(owed.pk)
    assert [m.to for m in mail.outbox] == [[rita.email]]


def test_a_role_change_drops_only_what_the_new_role_is_not_for():
    approval, rita = assigned_while_the_broker_is_down("rec-11")
    membership_set(
        tenant=approval.tenant, user=rita, role="compliance_officer",
        actor=Actor.system("tests"),
    )  # fmt: skip
    assert ApprovalNotice.objects.count() == 1  # deciders: still one
    membership_set(
        tenant=approval.tenant, user=rita, role="auditor", actor=Actor.system("tests")
    )
    assert not ApprovalNotice.objects.exists()


def test_a_notice_whose_subject_cannot_be_a_header_is_given_up(caplog):
    """A thread id stored before ids were matched whole can end in a newline:
    its notice's subject is a header Django refuses (BadHeaderError, no
    SMTPException), at every send. The task gives it up, as a 5xx refusal,
    instead of raising; nothing is sent, and nothing is left for the sweep
    to fail on at every run until it ages out."""
    approval, rita = assigned_while_the_broker_is_down("rec-12", stored_as="rec-12\n")
    (owed,) = ApprovalNotice.objects.all()
    send_notice.run(owed.pk)  # no exception: nothing for Celery to retry
    assert not ApprovalNotice.objects.exists() and not mail.outbox
    assert f"notice {owed.pk} of approval {approval.pk}" in caplog.text
    assert rita.email not in caplog.text


def test_the_sweep_gives_up_a_notice_whose_subject_cannot_be_a_header():
    assigned_while_the_broker_is_down("rec-13", stored_as="rec-13\n")
    minutes = NOTICE_GRACE.total_seconds() / 60 + 1
    assert sweep_after(minutes) == {"notices_given_up": 1}
    assert sweep_after(minutes + 5) == {}
    assert not ApprovalNotice.objects.exists() and not mail.outbox
