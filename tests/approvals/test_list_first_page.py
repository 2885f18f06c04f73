"""The approvals list's first page (no cursor) runs a query compiled once per
shape (approvals.api.views._FirstPage): it must be the query the ORM builds
for the same filters, to the statement and its parameters, and list the
same rows; a page with a cursor is the ORM's."""

from __future__ import annotations

import itertools
from urllib.parse import urlencode

import pytest
from django.db import connection
from django.utils import timezone

from approvals.api import views
from approvals.api.filters import ApprovalFilter
from approvals.api.views import _summary_page
from approvals.models import ApprovalRequest
from runs.models import Thread
from tests.approvals.helpers import waiting_request
from tests.factories import api_client, make_api_key, make_tenant

pytestmark = pytest.mark.django_db

VALUES = {"status": "pending", "risk": "low", "gate": "action", "thread_id": "t-2"}


def _tenant_with_requests():
    tenant = make_tenant()
    _, secret = make_api_key(tenant, ["approvals"])
    for n in (1, 2):
        waiting_request(tenant, thread_id=f"t-{n}")  # low risk
    waiting_request(tenant, amount="9000.00", thread_id="t-3")  # high risk
    gone = waiting_request(tenant, thread_id="t-gone")
    Thread.objects.filter(pk=gone.thread_id).update(deleted_at=timezone.now())
    decided = waiting_request(tenant, thread_id="t-4")
    ApprovalRequest.objects.filter(pk=decided.pk).update(status="approved")
    return tenant, api_client(secret)


def _recorded(statements: list):
    def record(execute, sql, params, many, context):
        statements.append((sql, tuple(params or ())))
        return execute(sql, params, many, context)

    return record


def _orm_page(tenant, given: dict, limit: int):
    filters = ApprovalFilter(queryset=ApprovalRequest.objects.none()).filters
    return _summary_page(
        tenant.pk,
        [filters[name] for name in given],
        list(given.values()),
        ("-created_at",),
        limit,
    )


@pytest.mark.parametrize(
    "names",
    [
        names
        for size in range(len(VALUES) + 1)
        for names in itertools.combinations(VALUES, size)
    ],
)
def test_a_first_page_runs_the_orm_s_statement_and_lists_its_rows(names):
    tenant, client = _tenant_with_requests()
    other = make_tenant()
    waiting_request(other, thread_id="t-2")  # another tenant's: never listed
    given = {name: VALUES[name] for name in names}
    for limit in (2, 50):
        query = urlencode({**given, "limit": limit})
        statements = []
        with connection.execute_wrapper(_recorded(statements)):
            listed = client.get(f"/api/v1/approvals?{query}")
        assert listed.status_code == 200, listed.content
        [ran] = [s for s in statements if "approvals_" in s[0]]
        expected = _orm_page(tenant, given, limit + 1)
        sql, params = expected.query.get_compiler(using="default").as_sql()
        assert ran == (sql, tuple(params))
        rows = [str(request.pk) for request in expected][:limit]
        assert [row["id"] for row in listed.json()["results"]] == rows
        assert all(row["thread_id"] != "t-gone" for row in listed.json()["results"])


def test_pages_of_other_sizes_cannot_crowd_out_the_compiled_first_page():
    # Each `limit` was a shape of its own: 64 of them filled the cap, and
    # every first page after went through the ORM for the process's life.
    _, client = _tenant_with_requests()
    views._FIRST_PAGES.clear()
    default = views.ApprovalListView.pagination_class.page_size
    for limit in (n for n in range(1, 80) if n != default):
        listed = client.get(f"/api/v1/approvals?status=pending&limit={limit}")
        assert listed.status_code == 200, listed.content
        assert len(listed.json()["results"]) == min(limit, 3)
    assert views._FIRST_PAGES == {}
    assert client.get("/api/v1/approvals?status=pending").status_code == 200
    assert list(views._FIRST_PAGES) == [(("status",), ("-created_at",))]


def test_the_pages_after_the_first_are_read_by_the_orm_and_follow_it():
    tenant, client = _tenant_with_requests()
    expected = [
        str(pk)
        for pk in ApprovalRequest.objects.filter(
            tenant=tenant, thread__deleted_at__isnull=True, status="pending"
        )
        .order_by("-created_at")
        .values_list("pk", flat=True)
    ]
    assert len(expected) == 3
    seen, url = [], "/api/v1/approvals?status=pending&limit=2"
    while url:
        page = client.get(url)
        assert page.status_code == 200, page.content
        seen += [row["id"] for row in page.json()["results"]]
        url = page.json()["next"]
    assert seen == expected


@pytest.mark.parametrize(
    "query, status, code, field",
    [
        ("status=null", 400, "invalid", "status"),  # a choice filter's null value
        ("risk=extreme", 400, "invalid", "risk"),
        ("thread_id=" + "x" * 256, 400, "invalid", "thread_id"),
        ("cursor=nope", 404, "not_found", None),
    ],
)
def test_a_bad_filter_or_cursor_is_refused_as_before(query, status, code, field):
    _, client = _tenant_with_requests()
    answer = client.get(f"/api/v1/approvals?{query}")
    assert answer.status_code == status, answer.content
    assert answer.json()["code"] == code
    if field:
        assert field in answer.json()["fields"]


def test_an_empty_filter_is_no_filter():
    _, client = _tenant_with_requests()
    answer = client.get("/api/v1/approvals?gate=&status=")
    assert answer.status_code == 200, answer.content
    assert {row["thread_id"] for row in answer.json()["results"]} == {
        "t-1",
        "t-2",
        "t-3",
        "t-4",
    }


def test_the_list_needs_the_approvals_scope_before_any_page_is_read():
    # The scope is checked before the list's first page (compiled or not).
    tenant, _ = _tenant_with_requests()
    _, secret = make_api_key(tenant, ["runs"])
    for query in ("", "?status=pending", "?status=pending&limit=2"):
        response = api_client(secret).get(f"/api/v1/approvals{query}")
        assert response.status_code == 403
        assert response.json()["code"] == "permission_denied"
