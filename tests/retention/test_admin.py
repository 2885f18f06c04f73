"""Retention in the admin: policies, legal holds and subject deletions."""

import json

import pytest
from django.test import Client

from audit.models import AuditEvent
from retention.models import DeletionRequest, LegalHold, RetentionPolicy
from runs.models import Thread
from tests.factories import make_member, make_tenant
from tests.retention.helpers import make_thread

pytestmark = pytest.mark.django_db

CHAIN = [
    {"name": "remind", "after_hours": 0, "notify": ["reviewer"]},
    {"name": "escalate", "after_hours": 2, "notify": ["compliance_officer"]},
]


def logged_in(tenant, role) -> Client:
    client = Client()
    client.user = make_member(tenant, role=role).user
    client.force_login(client.user)
    return client


def policy_form(tenant, **changes) -> dict:
    form = {
        "tenant": tenant.pk,
        "checkpoint_ttl_days": 30,
        "keep_latest_checkpoints": 5,
        "audit_retention_days": 365,
        "approval_due_hours_low": 24,
        "approval_due_hours_medium": 8,
        "approval_due_hours_high": 2,
        "escalation_chain": json.dumps(CHAIN),
        "expire_after_hours": 12,
        "final_action": "deny",
    }
    return {**form, **changes}


def test_a_tenant_admin_sets_a_validated_and_audited_policy():
    tenant = make_tenant()
    admin = logged_in(tenant, "tenant_admin")
    refused = admin.post(
        "/admin/retention/retentionpolicy/add/",
        policy_form(tenant, audit_retention_days=7),
    )
    assert refused.status_code == 200
    assert "cannot be shorter than the checkpoint TTL" in refused.content.decode()
    assert not RetentionPolicy.objects.exists()

    saved = admin.post("/admin/retention/retentionpolicy/add/", policy_form(tenant))
    assert saved.status_code == 302, saved.content.decode()[:2000]
    policy = RetentionPolicy.objects.get(tenant=tenant)
    assert policy.approval_due_hours_high == 2 and policy.escalation_chain == CHAIN
    assert (
        AuditEvent.objects.for_tenant(tenant)
        .filter(kind="retention.policy_changed")
        .exists()
    )
    reviewer = logged_in(tenant, "reviewer")
    page = reviewer.get(f"/admin/retention/retentionpolicy/{policy.pk}/change/")
    assert page.status_code in (302, 403)


def test_a_compliance_officer_places_and_lifts_a_legal_hold():
    tenant = make_tenant()
    thread = make_thread(tenant, "case-1", steps=1)
    officer = logged_in(tenant, "compliance_officer")
    missing = officer.post(
        "/admin/retention/legalhold/add/",
        {"tenant": tenant.pk, "thread_ref": "ghost", "reason": "matter 12"},
    )
    assert "has no live thread" in missing.content.decode()
    placed = officer.post(
        "/admin/retention/legalhold/add/",
        {"tenant": tenant.pk, "thread_ref": "case-1", "reason": "matter 12"},
    )
    assert placed.status_code == 302
    hold = LegalHold.objects.get()
    assert hold.thread == thread and Thread.objects.get(pk=thread.pk).legal_hold
    officer.post(
        "/admin/retention/legalhold/",
        {"action": "lift", "_selected_action": [hold.pk]},
    )
    hold.refresh_from_db()
    assert (
        hold.lifted_at is not None and not Thread.objects.get(pk=thread.pk).legal_hold
    )
    kinds = AuditEvent.objects.for_tenant(tenant).values_list("kind", flat=True)
    assert {"legal_hold.placed", "legal_hold.lifted"} <= set(kinds)
    auditor = logged_in(tenant, "auditor")
    assert auditor.get("/admin/retention/legalhold/add/").status_code == 403


def test_a_compliance_officer_asks_for_a_subject_deletion_in_the_admin():
    tenant = make_tenant()
    make_thread(tenant, "jane-1", steps=1, subject="jane@example.com")
    officer = logged_in(tenant, "compliance_officer")
    response = officer.post(
        "/admin/retention/deletionrequest/add/",
        {"tenant": tenant.pk, "subject": "jane@example.com"},
    )
    assert response.status_code == 302
    request = DeletionRequest.objects.get()
    assert request.kind == "subject" and request.status == "shredded"
    assert request.requested_by == officer.user.username
    page = officer.get(f"/admin/retention/deletionrequest/{request.pk}/change/")
    assert page.status_code == 200 and "jane@example.com" not in page.content.decode()
    auditor = logged_in(tenant, "auditor")
    assert auditor.get("/admin/retention/deletionrequest/").status_code == 200
    assert auditor.get("/admin/retention/deletionrequest/add/").status_code == 403
