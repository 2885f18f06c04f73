"""Waiting on a human: the dashboard of pending requests and reviewers."""

from __future__ import annotations

import datetime
import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals import dashboard
from approvals.desk_models import DecisionSnapshot, RequestOpening
from approvals.models import ApprovalRequest, Decision
from tests.approvals.helpers import decide_url, logged_in, open_card, waiting_request
from tests.factories import make_member, make_superuser, make_tenant

pytestmark = pytest.mark.django_db

DASHBOARD = "/admin/approvals/approvalrequest/dashboard/"


def _aged(approval, **delta):
    ApprovalRequest.objects.filter(pk=approval.pk).update(
        created_at=timezone.now() - datetime.timedelta(**delta)
    )


def _row(html: str, slug: str) -> list[str]:
    row = re.search(rf">{slug}</a></td>(.*?)</tr>", html, re.S)[1]
    return re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)


def test_pending_requests_per_tenant_by_age():
    tenant, other = make_tenant("acme"), make_tenant("globex")
    _aged(waiting_request(tenant), minutes=20)
    _aged(waiting_request(tenant), minutes=40)
    _aged(waiting_request(tenant), hours=5)
    escalated = waiting_request(tenant)
    _aged(escalated, hours=30)
    ApprovalRequest.objects.filter(pk=escalated.pk).update(escalation_level=1)
    decided = waiting_request(tenant)
    ApprovalRequest.objects.filter(pk=decided.pk).update(status="approved")
    waiting_request(other)

    rows = dashboard.pending_by_tenant([tenant.pk])
    assert len(rows) == 1
    row = rows[0]
    assert (row["under_1h"], row["from_1h_to_24h"], row["over_24h"]) == (2, 1, 1)
    assert row["escalated"] == 1 and row["total"] == 4
    assert row["oldest_waited"].startswith("1 d 6 h")

    html = logged_in(make_member(tenant).user).get(DASHBOARD).content.decode()
    cells = _row(html, "acme")
    assert cells[:3] == ["2", "1", '<span class="desk-overdue">1</span>']
    assert "globex" not in html


def test_superuser_dashboard_covers_every_tenant_and_totals():
    for slug, count in [("acme", 2), ("globex", 3)]:
        tenant = make_tenant(slug)
        for _ in range(count):
            waiting_request(tenant)
    html = logged_in(make_superuser()).get(DASHBOARD).content.decode()
    assert "acme" in html and "globex" in html
    totals = re.search(r"<tfoot>(.*?)</tfoot>", html, re.S)[1]
    assert re.findall(r"<th[^>]*>(\d+)</th>", totals)[-1] == "5"


def test_oldest_waiting_request_is_listed_first():
    tenant = make_tenant()
    newer = waiting_request(tenant, thread_id="newer")
    older = waiting_request(tenant, thread_id="older")
    _aged(newer, hours=2)
    _aged(older, hours=50)
    html = logged_in(make_member(tenant).user).get(DASHBOARD).content.decode()
    table = re.search(r'id="desk-oldest".*?</table>', html, re.S)[0]
    assert table.index("older") < table.index("newer")
    assert "2 d 2 h" in table


def _decide(client, approval, verdict="approve", note=""):
    _, opening = open_card(client, approval)
    response = client.post(
        decide_url(approval), {"verdict": verdict, "note": note, "opening": opening}
    )
    assert response.status_code == 302, response.content[:500]


def test_reviewer_statistics_show_rate_and_median_time_to_decide():
    tenant = make_tenant()
    careful = make_member(tenant, username="careful").user
    stamper = make_member(tenant, username="stamper").user
    careful_client, stamper_client = logged_in(careful), logged_in(stamper)
    for index in range(4):
        approval = waiting_request(tenant)
        verdict = "deny" if index % 2 else "approve"
        _decide(careful_client, approval, verdict, note="checked")
    for _ in range(6):
        _decide(stamper_client, waiting_request(tenant))
    # The careful reviewer read each request for 4, 6, 8, 10 minutes.
    snapshots = DecisionSnapshot.objects.filter(decision__reviewer_user=careful)
    ordered = snapshots.order_by("created_at")
    for minutes, snapshot in zip([4, 6, 8, 10], ordered, strict=True):
        decided_at = snapshot.decision.created_at
        DecisionSnapshot.objects.filter(pk=snapshot.pk).update(
            first_opened_at=decided_at - datetime.timedelta(minutes=minutes)
        )

    rows = {row["reviewer_label"]: row for row in dashboard.reviewer_stats([tenant.pk])}
    assert rows["careful"]["decisions"] == 4 and rows["careful"]["approved"] == 2
    assert rows["careful"]["median"] == datetime.timedelta(minutes=7)
    assert rows["careful"]["rubber_stamp"] is False
    assert rows["stamper"]["decisions"] == 6
    assert rows["stamper"]["approval_rate"] == 1.0
    assert rows["stamper"]["median"] < datetime.timedelta(seconds=15)
    assert rows["stamper"]["rubber_stamp"] is True

    officer = make_member(tenant, role="compliance_officer").user
    html = logged_in(officer).get(DASHBOARD).content.decode()
    table = re.search(r'id="desk-reviewers".*?</table>', html, re.S)[0]
    careful_row = re.search(r"careful</td>(.*?)</tr>", table, re.S)[1]
    assert "50 %" in careful_row and "7 min" in careful_row
    stamper_row = re.search(r"stamper</td>(.*?)</tr>", table, re.S)[1]
    assert "100 %" in stamper_row and "approves nearly everything" in stamper_row


def test_decisions_older_than_thirty_days_are_not_counted():
    tenant = make_tenant()
    reviewer = make_member(tenant).user
    client = logged_in(reviewer)
    _decide(client, waiting_request(tenant))
    _decide(client, waiting_request(tenant))
    Decision.objects.filter(
        pk=Decision.objects.order_by("created_at").first().pk
    ).update(created_at=timezone.now() - datetime.timedelta(days=31))
    (row,) = dashboard.reviewer_stats([tenant.pk])
    assert row["decisions"] == 1


def test_reviewer_statistics_are_for_compliance_officers_and_auditors_only():
    tenant = make_tenant()
    waiting_request(tenant)
    reviewer_page = logged_in(make_member(tenant).user).get(DASHBOARD)
    assert 'id="desk-reviewers"' not in reviewer_page.content.decode()
    for role in ("compliance_officer", "auditor"):
        page = logged_in(make_member(tenant, role=role).user).get(DASHBOARD)
        assert 'id="desk-reviewers"' in page.content.decode(), role


def test_statistics_of_another_tenant_are_not_shown():
    tenant, other = make_tenant(), make_tenant()
    outsider = make_member(other, username="outsider").user
    _decide(logged_in(outsider), waiting_request(other))
    officer = make_member(tenant, role="compliance_officer").user
    html = logged_in(officer).get(DASHBOARD).content.decode()
    assert "outsider" not in html


def test_tenant_admin_cannot_open_the_dashboard():
    tenant = make_tenant()
    client = logged_in(make_member(tenant, role="tenant_admin").user)
    assert client.get(DASHBOARD).status_code == 403


def test_admin_index_links_to_the_dashboard_for_desk_roles_only():
    tenant = make_tenant()
    html = logged_in(make_member(tenant).user).get("/admin/").content.decode()
    assert f'href="{DASHBOARD}"' in html
    admin_html = logged_in(make_member(tenant, role="tenant_admin").user).get("/admin/")
    assert f'href="{DASHBOARD}"' not in admin_html.content.decode()


def test_dashboard_query_count_does_not_grow_with_the_queue():
    tenant = make_tenant()
    officer = make_member(tenant, role="compliance_officer").user
    client = logged_in(officer)
    _decide(logged_in(make_member(tenant).user), waiting_request(tenant))
    waiting_request(tenant)
    client.get(DASHBOARD)
    with CaptureQueriesContext(connection) as few:
        client.get(DASHBOARD)
    for _ in range(10):
        waiting_request(tenant)
    _decide(logged_in(make_member(tenant).user), waiting_request(tenant))
    with CaptureQueriesContext(connection) as many:
        client.get(DASHBOARD)
    assert len(many) == len(few) <= 15
    assert RequestOpening.objects.count() == 2
