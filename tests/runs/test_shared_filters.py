"""runs.api.filters.SharedFilterSet: filters and form class built once."""

import django_filters
import pytest
from django.http import QueryDict

from approvals.api.filters import ApprovalFilter
from approvals.models import ApprovalRequest
from runs.api.filters import SharedFilterSet, ThreadFilter
from runs.models import Thread


def test_requests_share_the_filters_form_class_and_fields_not_the_form():
    first = ThreadFilter(QueryDict("status=idle"), Thread.objects.none())
    second = ThreadFilter(QueryDict("status=asleep"), Thread.objects.none())
    assert first.filters is second.filters
    assert type(first.form) is type(second.form)
    assert first.form is not second.form
    assert first.form.fields is second.form.fields
    assert first.is_valid() and not second.is_valid()
    assert first.form.cleaned_data["status"] == "idle"
    assert "status" in second.errors and first.errors == {}
    # Each form's data and what it cleaned are its own.
    third = ThreadFilter(
        QueryDict("status=running&agent=refund"), Thread.objects.none()
    )
    assert third.is_valid()
    assert third.form.cleaned_data == {"status": "running", "agent": "refund"}
    assert first.form.cleaned_data == {"status": "idle", "agent": ""}


def test_each_class_has_its_own():
    threads = ThreadFilter(QueryDict(), Thread.objects.none())
    approvals = ApprovalFilter(QueryDict(), ApprovalRequest.objects.none())
    assert set(threads.filters) == {"status", "agent"}
    assert set(approvals.filters) == {"status", "risk", "gate", "thread_id"}


def test_a_filter_that_needs_its_filterset_is_refused():
    class ByMethod(SharedFilterSet):
        agent = django_filters.CharFilter(method="by_agent")

        class Meta:
            model = Thread
            fields = ["agent"]

        def by_agent(self, queryset, name, value):
            return queryset

    with pytest.raises(TypeError, match="needs its FilterSet"):
        ByMethod(QueryDict(), Thread.objects.none())
