"""E-mails about approval requests: to a reviewer when a request is assigned
to them or escalated to their role, to compliance officers when one expires.

Each mail names the request (action, risk, tenant, thread, times) and links
to its card; it never holds the customer's content (the payload, the
arguments, the thread's messages): who may read those reads them on the card,
where the read is audited. Mails leave after the transaction that caused them
commits, through the Celery task `approvals.send_notice` (retried while the
mail server is down), by Django's mail framework: the console backend in the
embedded mode, SMTP as configured in production (docs/configuration.md).

Each mail owed is a row (approvals.models.ApprovalNotice) written in the
transaction of the change, so that none is lost with a message the broker
never took or a worker killed holding it: the approvals sweep sends what the
task has not after NOTICE_GRACE (send_owed says what is guaranteed).

A notice is for a member of the tenant as one of its roles (the assignee as
a decider, a hop's roles, compliance officers): it is sent only while its
recipient is still an active member with one of those roles, at that address
(send_owed checks it, under the row's lock); removing the membership, or
deactivating the user, deletes what is owed to them (approvals.receivers).
"""

from __future__ import annotations

import logging
import smtplib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.mail import BadHeaderError, EmailMessage
from django.db import transaction

from approvals.models import ApprovalNotice, ApprovalRequest
from runs import dispatch, permissions
from runs.models import Membership, Role

logger = logging.getLogger(__name__)

SEND_NOTICE = "approvals.send_notice"  # approvals.tasks.send_notice
TIME_FORMAT = "%Y-%m-%d %H:%M:%S UTC"
# How old an unsent notice is before the sweep sends it: longer than the
# task's own send and its retries through a short mail server outage take,
# so that the sweep does not do the task's work in normal operation. (It
# could not send a mail twice if it did: the row lock, send_owed.)
NOTICE_GRACE = timedelta(minutes=15)
# How long a notice the mail server keeps failing stays owed: past this the
# sweep gives it up (deletes it, logged by ids), as Celery's retries gave up
# before notices were owed in the database. A day: a reminder later than
# that tells a reviewer nothing the queue does not.
NOTICE_MAX_AGE = timedelta(days=1)


@dataclass(frozen=True)
class Notice:
    subject: str
    body: str
    recipients: tuple[str, ...]  # each gets a message of their own
    # The user each recipient is, in the same order, and the roles the
    # notice is for (ApprovalNotice.user, .roles).
    users: tuple[int, ...]
    roles: tuple[str, ...]


def card_link(approval: ApprovalRequest) -> str:
    return (
        f"{settings.GATEHOUSE_BASE_URL.rstrip('/')}/admin/approvals/"
        f"approvalrequest/{approval.pk}/change/"
    )


def members_of_roles(tenant_id: int, roles) -> list[tuple[str, int]]:
    """(e-mail address, user pk) of the tenant's active members with these
    roles, one per address, by address."""
    users = get_user_model().objects.filter(
        is_active=True,
        pk__in=Membership.objects.filter(tenant_id=tenant_id, role__in=roles).values(
            "user_id"
        ),
    )
    first: dict[str, int] = {}
    for email, pk in users.order_by("pk").values_list("email", "pk"):
        if email:
            first.setdefault(email, pk)
    return sorted(first.items())


def notice(
    approval: ApprovalRequest,
    *,
    headline: str,
    lines: list[str],
    recipients: list[tuple[str, int]],
    roles,
) -> Notice:
    """A mail about one request: what it is, where to open it, and `lines`."""
    subject = (
        f"[Gatehouse] {headline}: {approval.action} ({approval.risk} risk), "
        f"thread {approval.thread.thread_id}"
    )
    body = "\n".join(
        [
            *lines,
            "",
            f"Tenant: {approval.tenant.slug}",
            f"Action: {approval.action}",
            f"Risk: {approval.risk}",
            f"Thread: {approval.thread.thread_id}",
            f"Requested: {approval.created_at.astimezone(UTC):{TIME_FORMAT}}",
            f"Due: {approval.due_at.astimezone(UTC):{TIME_FORMAT}}",
            "",
            f"Open the request: {card_link(approval)}",
            "",
            "What the request is about is on its card, for those allowed to read "
            "it; this message carries none of it.",
        ]
    )
    return Notice(
        subject=subject,
        body=body,
        recipients=tuple(email for email, _ in recipients),
        users=tuple(pk for _, pk in recipients),
        roles=tuple(sorted(Role(role).value for role in roles)),
    )


def send_on_commit(approval: ApprovalRequest, item: Notice) -> None:
    """Owe the mail in the current transaction and send it when that commits
    (nothing is owed or sent for a change that rolls back)."""
    owed = ApprovalNotice.objects.bulk_create(
        ApprovalNotice(
            tenant_id=approval.tenant_id,
            request=approval,
            recipient=address,
            user_id=user_pk,
            roles=list(item.roles),
            subject=item.subject,
            body=item.body,
        )
        for address, user_pk in zip(item.recipients, item.users, strict=True)
    )
    for row in owed:
        dispatch.task_send_on_commit(SEND_NOTICE, row.pk)


def send_owed(owed) -> ApprovalNotice | None:
    """Send the first notice of `owed` (a queryset of ApprovalNotice) that no
    one else is sending, and delete it, in one transaction; the one sent, or
    None if there was none free.

    The row is locked (FOR UPDATE SKIP LOCKED) from before the send until
    its delete commits, so two senders (the task and a sweep, two sweeps)
    never both send it: the other skips it while it is locked and finds it
    gone after. A send that fails (the mail server down, or refusing for
    now) rolls the transaction back and raises: the notice stays owed; one
    the server refuses for good, or whose subject Django refuses as a header
    (BadHeaderError), is deleted and NoticeGivenUp raised, and so
    is one whose recipient is no longer an active member of the tenant with
    a role it is for (still_addressed), unsent. The one window
    is a sender that dies, or loses its database, after the mail server took
    the message and before the commit: the notice stays owed and is sent
    again, a duplicate; never none. (SQLite, the embedded mode, has no row
    locks: there the grace alone keeps the sweep off the task's send, and
    two sends at the same moment can both go out; docs/retention.md.)
    """
    with transaction.atomic():
        row = _first_free(owed)
        if row is None:
            return None
        if not still_addressed(row):
            # Removed from the tenant, deactivated, or no longer in a role it
            # was for since it was owed: not theirs to read any more. Given
            # up in this transaction, then said.
            given_up = _give_up(row, "its recipient is no longer a member it is for")
        else:
            given_up = _mail_owed(row)
    if given_up is not None:
        raise given_up
    return row


def _mail_owed(row: ApprovalNotice) -> NoticeGivenUp | None:
    """Send the (locked) notice and delete it, in the caller's transaction;
    the give-up, if the mail server refused it for good or Django its
    subject as a header."""
    try:
        mail(row.subject, row.body, row.recipient)
    except smtplib.SMTPException as error:
        if not _refused_for_good(error):
            raise
        # Sent again it would be refused again, at every sweep, its
        # address kept: given up in this transaction, then said.
        return _give_up(row, f"refused by the mail server ({_code(error)})")
    except BadHeaderError:
        # A header Django will not write (a newline in the subject: a thread
        # id stored before ids were matched whole). It would be refused at
        # every send, as a 5xx is: given up the same way.
        return _give_up(row, "its subject cannot be a mail header (a newline)")
    # By pk: the row is ours (locked) and already read.
    ApprovalNotice.objects.filter(pk=row.pk).delete()
    return None


def owed_to_member_dropped(*, tenant_id: int, user_id: int, role: str | None) -> int:
    """Delete what is owed to a member of the tenant: all of it when the
    membership is removed (`role` None), what is for other roles when their
    role changed to `role`. In the caller's transaction; how many."""
    owed = ApprovalNotice.objects.filter(tenant_id=tenant_id, user_id=user_id)
    if role is not None:
        # A few rows at most; read, as SQLite has no JSON containment.
        owed = owed.filter(
            pk__in=[
                pk
                for pk, roles in owed.values_list("pk", "roles")
                if roles and role not in roles
            ]
        )
    deleted, _ = owed.delete()
    return deleted


def still_addressed(row: ApprovalNotice) -> bool:
    """Whether the notice's recipient is still an active member of its tenant,
    with one of the roles it is for (any, for a notice that names none), at
    the address it is owed to."""
    members = Membership.objects.filter(
        tenant_id=row.tenant_id,
        user__is_active=True,
        user__email__iexact=row.recipient,
    )
    if row.user_id is not None:
        members = members.filter(user_id=row.user_id)
    if row.roles:
        members = members.filter(role__in=row.roles)
    return members.exists()


def mail(subject: str, body: str, recipient: str) -> None:
    """One message to one person, through Django's mail framework."""
    EmailMessage(subject, body, settings.DEFAULT_FROM_EMAIL, [recipient]).send()


def _first_free(owed) -> ApprovalNotice | None:
    """The oldest notice of `owed` no one else holds, locked until the
    caller's transaction ends (FOR UPDATE SKIP LOCKED)."""
    return owed.select_for_update(skip_locked=True).order_by("created_at", "pk").first()


class NoticeGivenUp(Exception):
    """A notice deleted unsent: the mail server refused it for good, its
    subject cannot be a header, or it was owed past NOTICE_MAX_AGE."""


def _give_up(row: ApprovalNotice, why: str) -> NoticeGivenUp:
    """Delete the (locked) notice, logged by its ids, never its address."""
    ApprovalNotice.objects.filter(pk=row.pk).delete()
    given_up = NoticeGivenUp(
        f"notice {row.pk} of approval {row.request_id}: {why}; given up"
    )
    logger.warning("%s", given_up)
    return given_up


def _refused_for_good(error: smtplib.SMTPException) -> bool:
    """A refusal the mail server would repeat (a 5xx reply, or every
    recipient refused with one); a 4xx or a lost connection is worth
    trying again."""
    if isinstance(error, smtplib.SMTPRecipientsRefused):
        return all(code >= 500 for code, _ in error.recipients.values())
    return isinstance(error, smtplib.SMTPResponseException) and error.smtp_code >= 500


def _code(error: smtplib.SMTPException) -> str:
    if isinstance(error, smtplib.SMTPRecipientsRefused):
        return "recipient refused"
    return f"SMTP {error.smtp_code}"


def give_up_stale(owed) -> bool:
    """Give up the first notice of `owed` that no one is sending (the
    sweep's, for one owed past NOTICE_MAX_AGE); False if none was free."""
    with transaction.atomic():
        row = _first_free(owed)
        if row is None:
            return False
        _give_up(row, f"owed for over {NOTICE_MAX_AGE}")
    return True


def owed_before(moment: datetime):
    """Notices owed since before `moment` (the sweep's: older than the grace)."""
    return ApprovalNotice.objects.filter(created_at__lt=moment)


# --- the occasions ------------------------------------------------------------------


def notify_assigned(*, approval: ApprovalRequest, assignee, assigned_by: str) -> Notice:
    item = notice(
        approval,
        headline="Assigned to you",
        lines=[f"{assigned_by} assigned you an approval request to decide."],
        recipients=(
            [(assignee.email, assignee.pk)]
            if assignee.is_active and assignee.email
            else []
        ),
        # As one of its deciders (request_reassign checks it).
        roles=permissions.roles_with(permissions.DECIDE),
    )
    send_on_commit(approval, item)
    return item


def notify_escalated(
    *, approval: ApprovalRequest, roles, step: str, level: int
) -> Notice:
    names = ", ".join(str(Role(role).label).lower() + "s" for role in roles)
    item = notice(
        approval,
        headline=f"Escalated ({step})",
        lines=[
            f"An approval request is unanswered and was escalated to the {names} "
            f"of the tenant (step {step}, level {level}).",
            "If nobody answers, it expires and is denied by the system.",
        ],
        recipients=members_of_roles(approval.tenant_id, roles),
        roles=roles,
    )
    send_on_commit(approval, item)
    return item


def notify_expired(*, approval: ApprovalRequest) -> Notice:
    item = notice(
        approval,
        headline="Expired",
        lines=[
            "Nobody answered this approval request in time: it expired, was "
            "denied by the system, and the run went on with the denial.",
        ],
        recipients=members_of_roles(
            approval.tenant_id, [Role.COMPLIANCE_OFFICER.value]
        ),
        roles=[Role.COMPLIANCE_OFFICER.value],
    )
    send_on_commit(approval, item)
    return item
