"""The reviewer queue's reads: what each request's safe arguments say, who
decided, the filters by reviewer and by decision, and the CSV export of a
filtered list.

Nothing here decrypts: the queue finds and exports requests by what is kept
in clear, under the audit trail's rule (audit/events.py): the arguments an
agent declares safe to show, labels of the people and keys who decided,
statuses and times. Notes and the other arguments never leave the payload.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import Exists, OuterRef, Q, QuerySet

from approvals.models import ApprovalRequest, Decision
from audit.export import FLUSH_BYTES, defuse, iso
from audit.redaction import DIGEST_PREFIX, describe
from runs import permissions

SAFE_ARGS_CHARS = 500
EXPORT_CHUNK_ROWS = 1000
SERVICE_KEYS = "keys"


def safe_args_text(args: Mapping[str, Any], safe_keys: Iterable[str]) -> str:
    """`order_id=A-1001 amount=40.00`: the declared-safe scalar arguments as
    the audit trail keeps them in clear (audit.redaction.describe); the other
    arguments are not named at all."""
    safe = frozenset(safe_keys)
    parts = [
        f"{key}={_clear(value)}"
        for key, value in describe(args, safe).items()
        if key in safe and not str(value).startswith(DIGEST_PREFIX)
    ]
    return " ".join(parts)[:SAFE_ARGS_CHARS]


def _clear(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return " ".join(str(value).split())


# --- Who decided ------------------------------------------------------------


def deciders(decisions: Iterable[Decision]) -> list[str]:
    """Who decided a request, in order, each once."""
    shown: list[str] = []
    for decision in decisions:
        if decision.reviewer_shown not in shown:
            shown.append(decision.reviewer_shown)
    return shown


def deciders_text(decisions: Iterable[Decision]) -> str:
    """`rita, sam`."""
    return ", ".join(deciders(decisions))


def verdicts_text(decisions: Iterable[Decision]) -> str:
    """`rita approved with edits; sam approved`."""
    return "; ".join(
        f"{decision.reviewer_shown} {decision.verdict}" for decision in decisions
    )


# --- Filters ----------------------------------------------------------------

VERDICTS = {
    "approved": ("Approved", Q(approved=True)),
    "edited": ("Approved with edits", Q(approved=True, args_edited=True)),
    "denied": ("Denied", Q(approved=False)),
}
UNDECIDED = "none"


def reviewer_choices(tenant_ids: list[int] | None) -> list[tuple[str, str]]:
    """The people who may decide in these tenants (None: every tenant), and
    service keys as one choice."""
    people = get_user_model().objects.filter(
        memberships__role__in=permissions.roles_with(permissions.DECIDE),
        is_active=True,
    )
    if tenant_ids is not None:
        people = people.filter(memberships__tenant_id__in=tenant_ids)
    choices = [
        (f"user:{pk}", username)
        for pk, username in people.order_by("username")
        .values_list("pk", "username")
        .distinct()
    ]
    return choices + [(SERVICE_KEYS, "Service keys")]


def _principal_q(reviewer: str) -> Q:
    if reviewer == SERVICE_KEYS:
        return Q(principal__startswith="key:")
    return Q(principal=reviewer)


def filter_decided(
    queryset: QuerySet[ApprovalRequest], *, reviewer: str, verdict: str
) -> QuerySet[ApprovalRequest]:
    """Requests with a decision by `reviewer` (a principal, or all service
    keys) of kind `verdict`, either one optional: "rita denied" is one
    decision, not rita's on one request and someone's denial on another.
    `verdict` "none": requests nobody decided."""
    if verdict == UNDECIDED:
        undecided = ~Exists(Decision.objects.filter(request=OuterRef("pk")))
        queryset = queryset.filter(undecided)
        verdict = ""
    condition = Q()
    if reviewer:
        condition &= _principal_q(reviewer)
    if verdict in VERDICTS:
        condition &= VERDICTS[verdict][1]
    if not condition:
        return queryset
    decided = Decision.objects.filter(condition, request=OuterRef("pk"))
    return queryset.filter(Exists(decided))


# --- The export -------------------------------------------------------------

EXPORT_COLUMNS = (
    "id",
    "tenant",
    "created_at",
    "action",
    "safe_args",
    "risk",
    "gate",
    "status",
    "escalation_level",
    "assigned_to",
    "decided_at",
    "decided_by",
    "decisions",
    "thread_id",
    "run_id",
)


def _export_row(request: ApprovalRequest) -> list[Any]:
    decisions = list(request.decisions.all())
    assignment = getattr(request, "assignment", None)
    row = [
        str(request.pk),
        defuse(request.tenant.slug),
        iso(request.created_at),
        defuse(request.action),
        defuse(request.safe_args),
        request.risk,
        request.gate,
        request.status,
        request.escalation_level,
        defuse(assignment.assignee.get_username() if assignment else ""),
        iso(request.decided_at) if request.decided_at else "",
        defuse(deciders_text(decisions)),
        defuse(verdicts_text(decisions)),
        defuse(request.thread.thread_id),
        str(request.run_id),
    ]
    return row


def csv_chunks(queryset: QuerySet[ApprovalRequest]) -> Iterator[str]:
    """The requests of `queryset` (a filtered queue) as CSV, streamed.

    The audit export's rules: cells a spreadsheet would run as a formula are
    defused, times are ISO 8601 in UTC, and only what is kept in clear is
    written (no note, no argument an agent did not declare safe).
    """
    rows = queryset.select_related(
        "tenant", "thread", "assignment__assignee"
    ).prefetch_related("decisions")
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(EXPORT_COLUMNS)
    with transaction.atomic():
        for request in rows.iterator(chunk_size=EXPORT_CHUNK_ROWS):
            writer.writerow(_export_row(request))
            if buffer.tell() >= FLUSH_BYTES:
                yield buffer.getvalue()
                buffer.seek(0)
                buffer.truncate()
    yield buffer.getvalue()
