"""The audit admin: read-only for everyone, scoped by tenant, with the thread
timeline and the latest verification."""

import pytest
from django.test import Client

from audit import anchors, events, sealing
from audit.models import AuditEvent, AuditVerification
from audit.services import Actor, audit_verify, record
from tests.factories import make_member, make_superuser, make_tenant

pytestmark = pytest.mark.django_db
EVENTS = "/admin/audit/auditevent/"


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def thread_event(tenant, thread_id: str, slug: str = "x") -> AuditEvent:
    return record(
        tenant=tenant,
        kind=events.TENANT_CREATED,
        actor=Actor.agent("refund"),
        thread_id=thread_id,
        data={"slug": slug},
    )


def test_nobody_can_add_change_or_delete_events_not_even_a_superuser():
    tenant = make_tenant()
    event = thread_event(tenant, "case-1")
    admin = logged_in(make_superuser())
    assert admin.get(EVENTS).status_code == 200
    assert admin.get(f"{EVENTS}add/").status_code == 403
    change_page = admin.get(f"{EVENTS}{event.pk}/change/")
    assert change_page.status_code == 200
    assert b'name="_save"' not in change_page.content
    admin.post(f"{EVENTS}{event.pk}/change/", {"summary": "rewritten"})
    assert admin.get(f"{EVENTS}{event.pk}/delete/").status_code == 403
    admin.post(EVENTS, {"action": "delete_selected", "_selected_action": [event.pk]})
    event.refresh_from_db()
    assert event.summary == "tenant x created"


@pytest.mark.parametrize("role", ["auditor", "compliance_officer", "tenant_admin"])
def test_audit_roles_see_only_their_tenants_events(role):
    tenant_a, tenant_b = make_tenant(), make_tenant()
    thread_event(tenant_a, "visible-case")
    hidden = thread_event(tenant_b, "hidden-case")
    client = logged_in(make_member(tenant_a, role=role).user)
    listing = client.get(EVENTS).content.decode()
    assert "visible-case" in listing and "hidden-case" not in listing
    assert tenant_b.slug not in listing  # not even in the tenant filter
    assert client.get(f"{EVENTS}{hidden.pk}/change/").status_code in (302, 404)
    timeline = client.get(f"{EVENTS}timeline/{tenant_b.pk}/hidden-case/")
    assert timeline.status_code == 403


def test_a_reviewer_has_no_audit_admin():
    client = logged_in(make_member(make_tenant(), role="reviewer").user)
    assert client.get(EVENTS).status_code == 403
    assert client.get("/admin/audit/auditverification/").status_code == 403


def test_timeline_page_tells_the_threads_story():
    tenant = make_tenant()
    thread_event(tenant, "case-42", "first")
    thread_event(tenant, "case-42", "second")
    thread_event(tenant, "other", "unrelated")
    client = logged_in(make_member(tenant, role="auditor").user)
    listing = client.get(EVENTS).content.decode()
    url = f"{EVENTS}timeline/{tenant.pk}/case-42/"
    assert f'href="{url}"' in listing
    page = client.get(url, {"tz": "Europe/Paris"})
    assert page.status_code == 200
    html = page.content.decode()
    assert "tenant first created" in html and "tenant second created" in html
    assert "unrelated" not in html
    assert "Europe/Paris" in html
    assert client.get(f"{EVENTS}timeline/{tenant.pk}/nothing/").status_code == 404


def test_event_list_shows_the_latest_verification_of_each_chain():
    tenant = make_tenant()
    sealing.seal_all()
    audit_verify(tenant=tenant)
    broken = AuditVerification(
        tenant=tenant, ok=False, first_bad_seq=7, problem="event #7 is missing"
    )
    anchors.verification_sign(broken)
    broken.save()
    client = logged_in(make_member(tenant, role="auditor").user)
    html = client.get(EVENTS).content.decode()
    assert "broken at #7: event #7 is missing" in html
    assert "not signed by Gatehouse" not in html


def test_a_verification_written_behind_gatehouses_back_shows_as_unsigned():
    """A forged "ok" row, inserted straight into the table, is flagged."""
    tenant = make_tenant()
    forged = AuditVerification(tenant=tenant, ok=True, blocks=1, events=1)
    anchors.verification_sign(forged)
    forged.events = 2  # what was signed is not what is stored
    forged.save()
    client = logged_in(make_member(tenant, role="auditor").user)
    html = client.get(EVENTS).content.decode()
    assert "not signed by Gatehouse: this row was written behind its back" in html
    listing = client.get("/admin/audit/auditverification/").content.decode()
    assert 'alt="False"' in listing


def test_verify_now_records_a_verification():
    tenant = make_tenant()
    client = logged_in(make_member(tenant, role="compliance_officer").user)
    listing = client.get("/admin/audit/auditverification/")
    assert b"Verify now" in listing.content
    response = client.post("/admin/audit/auditverification/verify-now/", follow=True)
    assert b"all intact" in response.content
    assert tenant.audit_verifications.get().ok
    assert client.get("/admin/audit/auditverification/verify-now/").status_code == 405


def test_blocks_are_listed_read_only():
    tenant = make_tenant()
    sealing.seal_all()
    client = logged_in(make_superuser())
    listing = client.get("/admin/audit/auditblock/")
    assert listing.status_code == 200 and tenant.slug.encode() in listing.content
    assert client.get("/admin/audit/auditblock/add/").status_code == 403
