"""Each role on each surface: what the admin pages and the API let it do.

The expected table is written out here, role by role, rather than read from
runs.permissions: a change of the map that changes who may do what fails
this test until the table (and docs/admin.md) say the same.
"""

import pytest
from django.test import Client

from audit.models import AuditEvent
from retention.models import DeletionRequest
from runs.models import Role
from tests.approvals.helpers import card_url, waiting_request
from tests.factories import api_client, make_api_key, make_member, make_tenant
from tests.runs.test_approvals_flow import interrupted_thread

pytestmark = pytest.mark.django_db

R, C, A, T = (
    Role.REVIEWER,
    Role.COMPLIANCE_OFFICER,
    Role.AUDITOR,
    Role.TENANT_ADMIN,
)
EVERY_ROLE = {R, C, A, T}
COMPLIANCE_AND_AUDIT = {C, A, T}

# Admin pages: the roles that get the page; every other role gets 403.
ADMIN_PAGES = {
    "/admin/approvals/approvalrequest/": {R, C, A},
    "/admin/approvals/approvalrequest/dashboard/": {R, C, A},
    "/admin/audit/auditevent/": COMPLIANCE_AND_AUDIT,
    "/admin/audit/auditblock/": COMPLIANCE_AND_AUDIT,
    "/admin/audit/auditverification/": COMPLIANCE_AND_AUDIT,
    "/admin/retention/retentionpolicy/": COMPLIANCE_AND_AUDIT,
    "/admin/retention/retentionpolicy/add/": {T},
    "/admin/retention/legalhold/": COMPLIANCE_AND_AUDIT,
    "/admin/retention/legalhold/add/": {C},
    "/admin/retention/deletionrequest/": COMPLIANCE_AND_AUDIT,
    "/admin/retention/deletionrequest/add/": {C, T},
    "/admin/runs/thread/": EVERY_ROLE,
    "/admin/runs/run/": EVERY_ROLE,
    "/admin/runs/membership/": COMPLIANCE_AND_AUDIT,
    "/admin/runs/membership/add/": {T},
    "/admin/runs/apikey/": COMPLIANCE_AND_AUDIT,
    "/admin/runs/apikey/add/": {T},
    "/admin/axes/accessattempt/": {C},
    "/admin/webhooks/webhooksubscription/": COMPLIANCE_AND_AUDIT,
    "/admin/webhooks/webhooksubscription/add/": {T},
    "/admin/webhooks/webhookdelivery/": COMPLIANCE_AND_AUDIT,
}


def member_client(tenant, role) -> Client:
    client = Client()
    client.force_login(make_member(tenant, role=role).user)
    return client


@pytest.mark.parametrize("role", sorted(EVERY_ROLE))
def test_each_role_gets_exactly_its_admin_pages(role):
    tenant = make_tenant()
    client = member_client(tenant, role)
    answers = {url: client.get(url).status_code for url in ADMIN_PAGES}
    expected = {
        url: 200 if role in roles else 403 for url, roles in ADMIN_PAGES.items()
    }
    assert answers == expected


@pytest.mark.parametrize("role", sorted(EVERY_ROLE))
def test_a_thread_page_decrypts_only_for_roles_that_read_content(role):
    tenant = make_tenant()
    approval = waiting_request(tenant)
    client = member_client(tenant, role)
    page_url = f"/admin/runs/thread/{approval.thread.pk}/change/"

    page = client.get(page_url)
    state = client.get(page_url, {"checkpoint": "latest"})

    assert page.status_code == 200
    reads_content = role in {R, C, A}
    assert ("?checkpoint=latest" in page.content.decode()) is reads_content
    assert state.status_code == (200 if reads_content else 403)


@pytest.mark.parametrize("role", sorted(EVERY_ROLE))
def test_the_request_card_opens_for_the_desk_roles_only(role):
    tenant = make_tenant()
    approval = waiting_request(tenant)
    response = member_client(tenant, role).get(card_url(approval))
    # A tenant admin's queue holds no request: the card is not found.
    assert response.status_code == (200 if role in {R, C, A} else 404)


@pytest.mark.parametrize(
    "role, asks, reads",
    [(R, 403, 403), (C, 202, 200), (A, 403, 200), (T, 202, 200)],
)
def test_deletion_requests_over_the_api_follow_the_role(role, asks, reads):
    tenant = make_tenant()
    client = api_client()
    client.force_login(make_member(tenant, role=role).user)

    asked = client.post(
        "/api/v1/deletion-requests", {"subject": "jane@example.com"}, format="json"
    )
    listed = client.get("/api/v1/deletion-requests")

    assert (asked.status_code, listed.status_code) == (asks, reads)
    assert DeletionRequest.objects.count() == (1 if asks == 202 else 0)


def test_a_personal_key_asks_for_a_deletion_only_if_its_person_may():
    tenant = make_tenant()
    auditor = make_member(tenant, role=A).user
    officer = make_member(tenant, role=C).user
    _, auditors_key = make_api_key(tenant, ["runs"], user=auditor)
    _, officers_key = make_api_key(tenant, ["runs"], user=officer)
    body = {"subject": "jane@example.com"}

    refused = api_client(auditors_key).post(
        "/api/v1/deletion-requests", body, format="json"
    )
    accepted = api_client(officers_key).post(
        "/api/v1/deletion-requests", body, format="json"
    )

    assert refused.status_code == 403
    assert refused.json()["code"] == "permission_denied"
    assert accepted.status_code == 202


@pytest.mark.django_db(transaction=True)
@pytest.mark.worker
def test_interrupt_values_over_the_api_only_for_roles_that_read_content(worker):
    tenant = make_tenant()
    _, secret = make_api_key(tenant)
    interrupted_thread(api_client(secret), "gate")

    seen = {}
    for role in sorted(EVERY_ROLE):
        client = api_client()
        client.force_login(make_member(tenant, role=role).user)
        body = client.get("/api/v1/threads/t1").json()
        assert body["status"] == "interrupted" and body["pending_approvals"]
        seen[role] = [entry["value"]["action"] for entry in body.get("interrupts", [])]

    assert seen == {R: ["do_one"], C: ["do_one"], A: ["do_one"], T: []}
    # Only what was decrypted was a read of content: three, not four.
    assert AuditEvent.objects.for_tenant(tenant).filter(kind="thread.read").count() == 3
