"""E-mails about approval requests: to a reviewer when a request is assigned
to them or escalated to their role, to compliance officers when one expires.

Each mail names the request (action, risk, tenant, thread, times) and links
to its card; it never holds the customer's content (the payload, the
arguments, the thread's messages): who may read those reads them on the card,
where the read is audited. Mails leave after the transaction that caused them
commits, through the Celery task `approvals.send_notice` (retried while the
mail server is down), by Django's mail framework: the console backend in the
embedded mode, SMTP as configured in production (docs/configuration.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC

from django.conf import settings
from django.contrib.auth import get_user_model

from approvals.models import ApprovalRequest
from runs import dispatch
from runs.models import Membership, Role

SEND_NOTICE = "approvals.send_notice"  # approvals.tasks.send_notice
TIME_FORMAT = "%Y-%m-%d %H:%M:%S UTC"


@dataclass(frozen=True)
class Notice:
    subject: str
    body: str
    recipients: tuple[str, ...]  # each gets a message of their own


def card_link(approval: ApprovalRequest) -> str:
    return (
        f"{settings.GATEHOUSE_BASE_URL.rstrip('/')}/admin/approvals/"
        f"approvalrequest/{approval.pk}/change/"
    )


def addresses_of_roles(tenant_id: int, roles) -> list[str]:
    """The e-mail addresses of the tenant's active members with these roles."""
    users = get_user_model().objects.filter(
        is_active=True,
        pk__in=Membership.objects.filter(tenant_id=tenant_id, role__in=roles).values(
            "user_id"
        ),
    )
    return sorted({email for email in users.values_list("email", flat=True) if email})


def notice(
    approval: ApprovalRequest, *, headline: str, lines: list[str], recipients
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
    return Notice(subject=subject, body=body, recipients=tuple(recipients))


def send_on_commit(item: Notice) -> None:
    """Queue the mail for when the current transaction commits (nothing is
    sent for a change that rolls back)."""
    for address in item.recipients:
        dispatch.task_send_on_commit(SEND_NOTICE, item.subject, item.body, address)


# --- the occasions ------------------------------------------------------------------


def notify_assigned(*, approval: ApprovalRequest, assignee, assigned_by: str) -> Notice:
    item = notice(
        approval,
        headline="Assigned to you",
        lines=[f"{assigned_by} assigned you an approval request to decide."],
        recipients=[assignee.email] if assignee.is_active and assignee.email else [],
    )
    send_on_commit(item)
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
        recipients=addresses_of_roles(approval.tenant_id, roles),
    )
    send_on_commit(item)
    return item


def notify_expired(*, approval: ApprovalRequest) -> Notice:
    item = notice(
        approval,
        headline="Expired",
        lines=[
            "Nobody answered this approval request in time: it expired, was "
            "denied by the system, and the run went on with the denial.",
        ],
        recipients=addresses_of_roles(
            approval.tenant_id, [Role.COMPLIANCE_OFFICER.value]
        ),
    )
    send_on_commit(item)
    return item
