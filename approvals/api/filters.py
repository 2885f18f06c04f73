"""Query-string filters of GET /api/v1/approvals (see runs.api.filters)."""

from __future__ import annotations

import django_filters

from approvals.models import ApprovalRequest, Gate, Risk
from runs.api.filters import SharedFilterSet, choice_filter


class ApprovalFilter(SharedFilterSet):
    status = choice_filter(ApprovalRequest.Status)
    risk = choice_filter(Risk)
    gate = choice_filter(Gate)
    thread_id = django_filters.CharFilter(
        field_name="thread__thread_id", max_length=255
    )

    class Meta:
        model = ApprovalRequest
        fields = ["status", "risk", "gate", "thread_id"]
