"""Everything links: audit events to their thread, run and request; a thread's
timeline to its page and requests; the thread's page to its requests with
their deciders, and to its timeline. Reads can be hidden from the event list."""

from __future__ import annotations

import pytest

from approvals.services import Reviewer, approval_decide, approval_read
from audit.services import Actor
from tests.approvals.helpers import logged_in, waiting_request
from tests.factories import make_member, make_tenant

pytestmark = pytest.mark.django_db

EVENTS = "/admin/audit/auditevent/"


@pytest.fixture
def tenant():
    return make_tenant()


@pytest.fixture
def officer(tenant):
    return make_member(tenant, role="compliance_officer", username="olga").user


@pytest.fixture
def decided(tenant):
    approval = waiting_request(tenant, thread_id="case-linked")
    rita = make_member(tenant, role="reviewer", username="rita").user
    approval_read(approval=approval, actor=Actor.user(rita), how="detail")
    approval_decide(
        approval=approval, reviewer=Reviewer.for_user(rita), approved=False, note="no"
    )
    return approval


def kinds(client, query: str = "") -> list[str]:
    response = client.get(EVENTS + query)
    assert response.status_code == 200
    return [event.kind for event in response.context["cl"].result_list]


def test_reads_are_hidden_or_shown_alone_with_one_filter(officer, decided):
    client = logged_in(officer)
    assert "approval.read" in kinds(client)
    assert "approval.read" not in kinds(client, "?reads=hide")
    assert "approval.decided" in kinds(client, "?reads=hide")
    assert set(kinds(client, "?reads=only")) == {"approval.read"}


def test_each_event_links_its_thread_run_and_request_with_short_ids(
    tenant, officer, decided
):
    html = logged_in(officer).get(EVENTS + "?kind=approval.decided").content.decode()
    run_id, approval_id = str(decided.run_id), str(decided.pk)
    assert (
        f'<a href="/admin/runs/run/{run_id}/change/" title="{run_id}">{run_id[:8]}…</a>'
        in html
    )
    assert (
        f'<a href="/admin/approvals/approvalrequest/{approval_id}/change/" '
        f'title="{approval_id}">{approval_id[:8]}…</a>' in html
    )
    thread = f"/admin/audit/auditevent/thread/{tenant.pk}/case-linked/"
    assert f'href="{thread}"' in html
    timeline = f"/admin/audit/auditevent/timeline/{tenant.pk}/case-linked/"
    assert f'href="{timeline}"' in html


def test_the_thread_link_leads_to_the_threads_page(tenant, officer, decided):
    client = logged_in(officer)
    url = f"/admin/audit/auditevent/thread/{tenant.pk}/case-linked/"
    response = client.get(url)
    assert response.status_code == 302
    assert response["Location"] == f"/admin/runs/thread/{decided.thread_id}/change/"
    missing = client.get(f"/admin/audit/auditevent/thread/{tenant.pk}/no-such/")
    assert missing.status_code == 404
    reviewer = make_member(tenant, role="reviewer").user
    assert logged_in(reviewer).get(url).status_code == 403
    other = make_tenant()
    assert client.get(f"/admin/audit/auditevent/thread/{other.pk}/x/").status_code == (
        403
    )


def test_the_timeline_links_the_thread_its_runs_and_requests(tenant, officer, decided):
    url = f"/admin/audit/auditevent/timeline/{tenant.pk}/case-linked/"
    html = logged_in(officer).get(url).content.decode()
    assert f'href="/admin/runs/thread/{decided.thread_id}/change/"' in html
    assert f'href="/admin/approvals/approvalrequest/{decided.pk}/change/"' in html
    assert f'href="/admin/runs/run/{decided.run_id}/change/"' in html
    assert 'href="/admin/approvals/approvalrequest/?q=case-linked"' in html


def test_the_thread_page_lists_its_requests_with_decisions_and_deciders(
    tenant, officer, decided
):
    page = f"/admin/runs/thread/{decided.thread_id}/change/"
    html = logged_in(officer).get(page).content.decode()
    assert f'href="/admin/approvals/approvalrequest/{decided.pk}/change/"' in html
    assert "denied by <strong>rita</strong>" in html
    timeline = f"/admin/audit/auditevent/timeline/{tenant.pk}/case-linked/"
    assert f'href="{timeline}"' in html

    reviewer = make_member(tenant, role="reviewer").user
    assert timeline not in logged_in(reviewer).get(page).content.decode()


def test_a_run_page_links_its_requests_and_for_auditors_the_timeline(
    tenant, officer, decided
):
    page = f"/admin/runs/run/{decided.run_id}/change/"
    html = logged_in(officer).get(page).content.decode()
    assert f'href="/admin/approvals/approvalrequest/{decided.pk}/change/"' in html
    timeline = f"/admin/audit/auditevent/timeline/{tenant.pk}/case-linked/"
    assert f'href="{timeline}"' in html
    reviewer = make_member(tenant, role="reviewer").user
    assert timeline not in logged_in(reviewer).get(page).content.decode()
