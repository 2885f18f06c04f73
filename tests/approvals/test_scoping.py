"""Who sees and does what on the reviewer's desk: tenants and roles, checked
on the server."""

from __future__ import annotations

import re

import pytest

from approvals.desk_models import Assignment, RequestOpening
from approvals.models import ApprovalRequest, Decision
from audit.models import AuditEvent
from tests.approvals.helpers import (
    card_url,
    decide_url,
    logged_in,
    open_card,
    waiting_request,
)
from tests.factories import make_member, make_superuser, make_tenant

pytestmark = pytest.mark.django_db

QUEUE = "/admin/approvals/approvalrequest/"
THREADS = "/admin/runs/thread/"
RUNS = "/admin/runs/run/"


@pytest.fixture
def tenants():
    return make_tenant("acme"), make_tenant("globex")


@pytest.fixture
def requests_(tenants):
    tenant_a, tenant_b = tenants
    return (
        waiting_request(tenant_a, thread_id="acme-case"),
        waiting_request(tenant_b, thread_id="globex-case"),
    )


def _filter_options(html: str) -> list[str]:
    """The tenant filter's choices (Django renders filters as links)."""
    section = re.search(r'data-filter-title="tenant".*?</ul>', html, re.S)
    assert section, "no tenant filter on the page"
    return re.findall(r'<a href="[^"]*"[^>]*>([^<]+)</a>', section[0])


def test_reviewer_sees_none_of_another_tenants_requests_or_threads(tenants, requests_):
    tenant_a, tenant_b = tenants
    approval_a, approval_b = requests_
    client = logged_in(make_member(tenant_a, role="reviewer").user)

    queue = client.get(QUEUE).content.decode()
    assert "acme-case" in queue and "globex-case" not in queue
    assert client.get(card_url(approval_b)).status_code == 404
    threads = client.get(THREADS).content.decode()
    assert "acme-case" in threads and "globex-case" not in threads
    thread_b = f"{THREADS}{approval_b.thread_id}/change/"
    assert client.get(thread_b).status_code == 404
    runs = client.get(RUNS).content.decode()
    assert "acme-case" in runs and "globex-case" not in runs
    assert client.get(f"{RUNS}{approval_b.run_id}/change/").status_code in (302, 404)


def test_tenant_dropdowns_list_only_the_users_tenants(tenants, requests_):
    tenant_a, _ = tenants
    client = logged_in(make_member(tenant_a, role="reviewer").user)
    for page in (QUEUE, THREADS, RUNS):
        options = _filter_options(client.get(page).content.decode())
        assert "acme" in options and "globex" not in options, page


def test_reassign_dropdown_lists_only_deciders_of_the_requests_tenant(
    tenants, requests_
):
    tenant_a, tenant_b = tenants
    approval_a, _ = requests_
    officer = make_member(tenant_a, role="compliance_officer").user
    colleague = make_member(tenant_a, role="reviewer", username="acme-rita").user
    make_member(tenant_a, role="auditor", username="acme-audrey")
    make_member(tenant_b, role="reviewer", username="globex-gus")
    html = logged_in(officer).get(card_url(approval_a)).content.decode()
    select = re.search(r'<select name="assignee".*?</select>', html, re.S)[0]
    assert colleague.username in select
    assert "globex-gus" not in select and "acme-audrey" not in select


def test_reviewer_cannot_decide_another_tenants_request_by_posting_its_id(
    tenants, requests_
):
    tenant_a, _ = tenants
    approval_a, approval_b = requests_
    client = logged_in(make_member(tenant_a, role="reviewer").user)
    _, opening_a = open_card(client, approval_a)
    response = client.post(
        decide_url(approval_b), {"verdict": "approve", "opening": opening_a}
    )
    assert response.status_code == 404
    approval_b.refresh_from_db()
    assert approval_b.status == "pending"
    assert not Decision.objects.filter(request=approval_b).exists()
    for action in ("reassign", "escalate"):
        url = f"{QUEUE}{approval_b.pk}/{action}/"
        assert client.post(url).status_code in (403, 404)


def test_superuser_sees_every_tenant(tenants, requests_):
    queue = logged_in(make_superuser()).get(QUEUE).content.decode()
    assert "acme-case" in queue and "globex-case" in queue


def test_auditor_reads_the_card_but_cannot_decide(tenants, requests_):
    tenant_a, _ = tenants
    approval_a, _ = requests_
    auditor = make_member(tenant_a, role="auditor").user
    client = logged_in(auditor)
    response, opening = open_card(client, approval_a)
    html = response.content.decode()
    assert 'id="desk-approve"' not in html and opening is None
    assert "deciding it needs the reviewer or compliance officer role" in html
    assert not RequestOpening.objects.filter(user=auditor).exists()

    # A forged opening does not help: the role is checked first.
    reviewer_client = logged_in(make_member(tenant_a, role="reviewer").user)
    _, forged = open_card(reviewer_client, approval_a)
    response = client.post(
        decide_url(approval_a), {"verdict": "approve", "opening": forged}
    )
    assert response.status_code == 403
    assert not Decision.objects.exists()


def test_tenant_admin_has_no_desk(tenants, requests_):
    tenant_a, _ = tenants
    approval_a, _ = requests_
    client = logged_in(make_member(tenant_a, role="tenant_admin").user)
    assert client.get(QUEUE).status_code == 403
    assert client.get(card_url(approval_a)).status_code in (403, 404)
    response = client.post(decide_url(approval_a), {"verdict": "approve"})
    assert response.status_code in (403, 404)
    assert not Decision.objects.exists()


def test_reviewer_cannot_manage_keys_members_or_tenants(tenants):
    tenant_a, _ = tenants
    client = logged_in(make_member(tenant_a, role="reviewer").user)
    for url in (
        "/admin/runs/apikey/",
        "/admin/runs/apikey/add/",
        "/admin/runs/membership/",
        "/admin/runs/membership/add/",
    ):
        assert client.get(url).status_code == 403, url
    response = client.post(
        "/admin/runs/apikey/add/",
        {"tenant": tenant_a.pk, "name": "sneaky", "scopes": ["runs"]},
    )
    assert response.status_code == 403
    assert client.get(f"/admin/runs/tenant/{tenant_a.pk}/change/").status_code in (
        200,
        403,
    )
    assert "sneaky" not in str(list(tenant_a.api_keys.values_list("name")))


def test_reviewer_cannot_reassign_or_escalate(tenants, requests_):
    tenant_a, _ = tenants
    approval_a, _ = requests_
    reviewer = make_member(tenant_a, role="reviewer").user
    client = logged_in(reviewer)
    html = client.get(card_url(approval_a)).content.decode()
    assert "Reassign" not in html and "Escalate now" not in html
    assert (
        client.post(f"{QUEUE}{approval_a.pk}/reassign/", {"assignee": reviewer.pk})
    ).status_code == 403
    assert client.post(f"{QUEUE}{approval_a.pk}/escalate/").status_code == 403
    approval_a.refresh_from_db()
    assert approval_a.escalation_level == 0
    assert not Assignment.objects.exists()


def test_compliance_officer_reassigns_and_escalates_with_audit(tenants, requests_):
    tenant_a, tenant_b = tenants
    approval_a, _ = requests_
    officer = make_member(tenant_a, role="compliance_officer").user
    rita = make_member(tenant_a, role="reviewer", username="rita").user
    outsider = make_member(tenant_b, role="reviewer").user
    client = logged_in(officer)

    client.post(f"{QUEUE}{approval_a.pk}/reassign/", {"assignee": outsider.pk})
    assert not Assignment.objects.exists()
    client.post(f"{QUEUE}{approval_a.pk}/reassign/", {"assignee": rita.pk})
    assert Assignment.objects.get(request=approval_a).assignee == rita
    client.post(f"{QUEUE}{approval_a.pk}/escalate/")
    approval_a.refresh_from_db()
    assert approval_a.escalation_level == 1 and approval_a.escalated_at

    kinds = set(AuditEvent.objects.for_tenant(tenant_a).values_list("kind", flat=True))
    assert {"approval.reassigned", "approval.escalated_manually"} <= kinds
    mine = logged_in(rita).get(QUEUE + "?assigned=me").content.decode()
    assert "acme-case" in mine


def test_escalating_a_decided_request_is_refused(tenants, requests_):
    tenant_a, _ = tenants
    approval_a, _ = requests_
    ApprovalRequest.objects.filter(pk=approval_a.pk).update(status="approved")
    officer = make_member(tenant_a, role="compliance_officer").user
    response = logged_in(officer).post(f"{QUEUE}{approval_a.pk}/escalate/", follow=True)
    assert "already approved" in response.content.decode()
    approval_a.refresh_from_db()
    assert approval_a.escalation_level == 0


def test_tenant_admin_sees_threads_but_not_their_decrypted_state(tenants, requests_):
    tenant_a, _ = tenants
    approval_a, _ = requests_
    client = logged_in(make_member(tenant_a, role="tenant_admin").user)
    url = f"{THREADS}{approval_a.thread_id}/change/"
    page = client.get(url).content.decode()
    assert "acme-case" in page and "?checkpoint=" not in page
    assert client.get(url + "?checkpoint=latest").status_code == 403
    assert not AuditEvent.objects.filter(kind="thread.state_read").exists()
