"""Waiting on a human: the reads behind the approvals dashboard.

Each function is one query whatever the number of requests: aggregates are
computed by the database, grouped by tenant or by reviewer. `tenant_ids` is
the list of tenants the viewer may see, or `ALL_TENANTS` for a superuser;
an empty list sees nothing.
"""

from __future__ import annotations

import datetime
import statistics
from typing import Any

from django.db import connection
from django.db.models import (
    Aggregate,
    Count,
    DurationField,
    F,
    Max,
    Min,
    Q,
    QuerySet,
)
from django.utils import timezone

from approvals.cards import duration_text
from approvals.desk_models import DecisionSnapshot
from approvals.models import ApprovalRequest, Decision
from runs.models import Tenant

ALL_TENANTS = object()
STATS_DAYS = 30
OLDEST_SHOWN = 10
# Flagged as possible rubber-stamping: nearly everything approved, fast.
RUBBER_STAMP_RATE = 0.95
RUBBER_STAMP_SECONDS = 15
RUBBER_STAMP_MIN_DECISIONS = 5


class Median(Aggregate):
    """PostgreSQL's continuous median, of numbers or intervals."""

    function = "PERCENTILE_CONT"
    name = "Median"
    template = "%(function)s(0.5) WITHIN GROUP (ORDER BY %(expressions)s)"
    output_field = DurationField()


def _scoped(queryset: QuerySet, tenant_ids, field: str = "tenant_id") -> QuerySet:
    if tenant_ids is ALL_TENANTS:
        return queryset
    return queryset.filter(**{f"{field}__in": list(tenant_ids)})


def pending_by_tenant(tenant_ids, now: datetime.datetime | None = None) -> list[dict]:
    """Per tenant: pending requests by age (<1 h, 1-24 h, >24 h), escalated,
    overdue and the oldest, oldest first."""
    now = now or timezone.now()
    hour_ago, day_ago = now - datetime.timedelta(hours=1), now - datetime.timedelta(1)
    rows = list(
        _scoped(ApprovalRequest.objects.filter(status="pending"), tenant_ids)
        .values("tenant_id")
        .annotate(
            # Counts of tenant_id, not of the id: index approval_pending_age
            # holds every column used, so the scan need not visit the table.
            total=Count("tenant"),
            under_1h=Count("tenant", filter=Q(created_at__gt=hour_ago)),
            from_1h_to_24h=Count(
                "tenant", filter=Q(created_at__lte=hour_ago, created_at__gt=day_ago)
            ),
            over_24h=Count("tenant", filter=Q(created_at__lte=day_ago)),
            escalated=Count("tenant", filter=Q(escalation_level__gt=0)),
            overdue=Count("tenant", filter=Q(due_at__lt=now)),
            oldest=Min("created_at"),
        )
        .order_by("oldest")
    )
    # The slugs apart: grouping by the id alone is the cheaper aggregate.
    slugs = dict(
        Tenant.objects.filter(pk__in=[row["tenant_id"] for row in rows]).values_list(
            "pk", "slug"
        )
    )
    for row in rows:
        row["slug"] = slugs[row["tenant_id"]]
        row["oldest_waited"] = duration_text(now - row["oldest"])
    return rows


def totals(rows: list[dict]) -> dict[str, int]:
    keys = ["total", "under_1h", "from_1h_to_24h", "over_24h", "escalated", "overdue"]
    return {key: sum(row[key] for row in rows) for key in keys}


def oldest_waiting(
    tenant_ids, now: datetime.datetime | None = None, limit: int = OLDEST_SHOWN
) -> list[ApprovalRequest]:
    now = now or timezone.now()
    rows = list(
        _scoped(ApprovalRequest.objects.filter(status="pending"), tenant_ids)
        .select_related("tenant", "thread")
        .only(
            "id",
            "action",
            "risk",
            "created_at",
            "due_at",
            "escalation_level",
            "tenant__slug",
            "thread__thread_id",
        )
        .order_by("created_at")[:limit]
    )
    for row in rows:
        row.waited = duration_text(now - row.created_at)
    return rows


def _medians_in_python(decisions: QuerySet) -> dict[str, datetime.timedelta]:
    """The median per principal where the database has no PERCENTILE_CONT."""
    spans: dict[str, list[float]] = {}
    rows = DecisionSnapshot.objects.filter(decision__in=decisions).values_list(
        "decision__principal", "decision__created_at", "first_opened_at"
    )
    for principal, decided, opened in rows:
        spans.setdefault(principal, []).append((decided - opened).total_seconds())
    return {
        key: datetime.timedelta(seconds=statistics.median(values))
        for key, values in spans.items()
    }


def reviewer_stats(
    tenant_ids, now: datetime.datetime | None = None, days: int = STATS_DAYS
) -> list[dict[str, Any]]:
    """Per reviewer over the last `days` days: decisions, approval rate, edits,
    and the median time from first opening the request to deciding (for the
    decisions taken on the desk; REST decisions have no opening).

    A reviewer is an authenticated principal (Decision.principal): a person,
    whether they decided in a session or through their personal key, or a
    service key, whatever names it sent."""
    now = now or timezone.now()
    decisions = _scoped(
        Decision.objects.filter(created_at__gte=now - datetime.timedelta(days)),
        tenant_ids,
        field="request__tenant_id",
    )
    aggregates = {
        "decisions": Count("pk"),
        "approved": Count("pk", filter=Q(approved=True)),
        "edited": Count("pk", filter=Q(args_edited=True)),
        "timed": Count("snapshot"),
    }
    in_database = connection.vendor == "postgresql"
    if in_database:
        aggregates["median"] = Median(F("created_at") - F("snapshot__first_opened_at"))
    rows = list(
        decisions.values("principal")
        .annotate(reviewer_label=Max("reviewer_label"), **aggregates)
        .order_by("-decisions", "reviewer_label")
    )
    medians = {} if in_database else _medians_in_python(decisions)
    for row in rows:
        if not in_database:
            row["median"] = medians.get(row["principal"])
        row["approval_rate"] = row["approved"] / row["decisions"]
        median = row["median"]
        row["median_text"] = duration_text(median) if median is not None else "—"
        row["rubber_stamp"] = (
            row["decisions"] >= RUBBER_STAMP_MIN_DECISIONS
            and row["approval_rate"] >= RUBBER_STAMP_RATE
            and median is not None
            and median.total_seconds() < RUBBER_STAMP_SECONDS
        )
    return rows
