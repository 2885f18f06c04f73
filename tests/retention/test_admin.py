"""Retention in the admin: policies, legal holds and subject deletions."""

import json

import pytest
from django.test import Client

from approvals.models import ApprovalRequest
from audit.models import AuditEvent
from retention.models import DeletionRequest, LegalHold, RetentionPolicy
from retention.services import deletion_carry_out
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
    lift = {"action": "lift", "_selected_action": [hold.pk]}
    # First what lifting it means, and nothing lifted yet.
    asked = officer.post("/admin/retention/legalhold/", lift).content.decode()
    assert "thread case-1 only" in asked and 'id="lift-holds"' in asked
    no_reason = officer.post(
        "/admin/retention/legalhold/", {**lift, "confirmed": "yes"}
    ).content.decode()
    assert "Say why the holds end." in no_reason
    hold.refresh_from_db()
    assert hold.lifted_at is None
    officer.post(
        "/admin/retention/legalhold/",
        {**lift, "confirmed": "yes", "lift_reason": "matter 12 closed"},
    )
    hold.refresh_from_db()
    assert hold.lift_reason == "matter 12 closed"
    assert (
        hold.lifted_at is not None and not Thread.objects.get(pk=thread.pk).legal_hold
    )
    kinds = AuditEvent.objects.for_tenant(tenant).values_list("kind", flat=True)
    assert {"legal_hold.placed", "legal_hold.lifted"} <= set(kinds)
    auditor = logged_in(tenant, "auditor")
    assert auditor.get("/admin/retention/legalhold/add/").status_code == 403


def test_a_compliance_officer_asks_for_a_subject_deletion_in_the_admin():
    tenant = make_tenant()
    jane = make_thread(tenant, "jane-1", steps=1, subject="jane@example.com")
    make_thread(tenant, "other", steps=1, subject="bob@example.com")
    approval = ApprovalRequest.objects.get(thread=jane)
    officer = logged_in(tenant, "compliance_officer")
    form = {"tenant": tenant.pk, "subject": "jane@example.com"}

    # First a confirmation page: the matched thread and its open approval.
    confirm = officer.post("/admin/retention/deletionrequest/add/", form)
    assert confirm.status_code == 200 and not DeletionRequest.objects.exists()
    assert "no-store" in confirm["Cache-Control"]
    page = confirm.content.decode()
    assert "jane-1" in page and "other" not in page
    assert f"/admin/approvals/approvalrequest/{approval.pk}/change/" in page
    assert "do_one" in page and "1 open approval request(s)" in page
    assert Thread.objects.get(pk=jane.pk).wrapped_data_key is not None

    response = officer.post(
        "/admin/retention/deletionrequest/add/", {**form, "_confirmed": "1"}
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


def test_a_request_that_matches_nothing_says_so_before_and_after():
    tenant = make_tenant()
    officer = logged_in(tenant, "compliance_officer")
    form = {"tenant": tenant.pk, "subject": "nobody@example.com"}
    confirm = officer.post("/admin/retention/deletionrequest/add/", form)
    assert 'id="no-thread-matched"' in confirm.content.decode()
    officer.post("/admin/retention/deletionrequest/add/", {**form, "_confirmed": "1"})
    request = DeletionRequest.objects.get()
    carry_out(request)
    request.refresh_from_db()
    assert (
        request.status == "completed" and request.record["note"] == "no thread matched"
    )
    page = officer.get(f"/admin/retention/deletionrequest/{request.pk}/change/")
    assert "No thread matched: nothing was deleted." in page.content.decode()
    listing = officer.get("/admin/retention/deletionrequest/").content.decode()
    assert "No thread matched" in listing


def test_one_thread_is_deleted_after_its_confirmation():
    tenant = make_tenant()
    thread = make_thread(tenant, "case-7", steps=1)
    officer = logged_in(tenant, "compliance_officer")
    missing = officer.post(
        "/admin/retention/deletionrequest/add/",
        {"tenant": tenant.pk, "thread_ref": "ghost"},
    )
    assert "has no live thread" in missing.content.decode()
    both = officer.post(
        "/admin/retention/deletionrequest/add/",
        {"tenant": tenant.pk, "thread_ref": "case-7", "subject": "x@example.com"},
    )
    assert "one of them" in both.content.decode()
    form = {"tenant": tenant.pk, "thread_ref": "case-7"}
    confirm = officer.post("/admin/retention/deletionrequest/add/", form)
    assert "case-7" in confirm.content.decode()
    assert "Yes, delete 1 thread(s)" in confirm.content.decode()
    officer.post("/admin/retention/deletionrequest/add/", {**form, "_confirmed": "1"})
    request = DeletionRequest.objects.get()
    assert request.kind == "thread" and request.thread_id == thread.pk
    assert Thread.objects.get(pk=thread.pk).wrapped_data_key is None


def test_held_threads_are_named_on_the_confirmation_and_holds_say_what_they_cover():
    tenant = make_tenant()
    make_thread(tenant, "held-1", steps=1, subject="jane@example.com")
    make_thread(tenant, "free-1", steps=1, subject="jane@example.com")
    officer = logged_in(tenant, "compliance_officer")
    officer.post(
        "/admin/retention/legalhold/add/",
        {"tenant": tenant.pk, "thread_ref": "held-1", "reason": "matter 12"},
    )
    officer.post(
        "/admin/retention/legalhold/add/",
        {"tenant": tenant.pk, "thread_ref": "", "reason": "matter 13"},
    )
    holds = officer.get("/admin/retention/legalhold/").content.decode()
    assert "thread held-1 only" in holds
    assert f"every thread of {tenant.slug}" in holds
    confirm = officer.post(
        "/admin/retention/deletionrequest/add/",
        {"tenant": tenant.pk, "subject": "jane@example.com"},
    ).content.decode()
    assert f"A legal hold covers every thread of {tenant}" in confirm


def test_forms_start_on_the_users_only_tenant():
    tenant = make_tenant()
    make_tenant()
    officer = logged_in(tenant, "compliance_officer")
    selected = f'<option value="{tenant.pk}" selected>'
    assert (
        selected
        in officer.get("/admin/retention/deletionrequest/add/").content.decode()
    )
    assert selected in officer.get("/admin/retention/legalhold/add/").content.decode()
    admin = logged_in(tenant, "tenant_admin")
    page = admin.get("/admin/retention/retentionpolicy/add/").content.decode()
    assert selected in page


def carry_out(request) -> None:
    while (
        deletion_carry_out(request=request)
        and DeletionRequest.objects.get(pk=request.pk).is_open
    ):
        pass


def test_the_policies_page_shows_the_defaults_for_tenants_without_one(settings):
    settings.GATEHOUSE_CHECKPOINT_TTL_DAYS = 45
    tenant, other = make_tenant(), make_tenant()
    admin = logged_in(tenant, "tenant_admin")
    page = admin.get("/admin/retention/retentionpolicy/").content.decode()
    assert 'id="defaults-in-force"' in page
    assert f"<strong>{tenant.slug}</strong>" in page and other.slug not in page
    assert "45 days" in page and "remind: 0 h later, notify reviewer" in page
    assert f"/admin/retention/retentionpolicy/add/?tenant={tenant.pk}" in page

    admin.post("/admin/retention/retentionpolicy/add/", policy_form(tenant))
    page = admin.get("/admin/retention/retentionpolicy/").content.decode()
    assert 'id="defaults-in-force"' not in page


def test_lifting_a_hold_lists_the_deletions_that_go_ahead():
    tenant = make_tenant()
    make_thread(tenant, "held-2", steps=1, subject="jane@example.com")
    officer = logged_in(tenant, "compliance_officer")
    officer.post(
        "/admin/retention/legalhold/add/",
        {"tenant": tenant.pk, "thread_ref": "held-2", "reason": "matter 14"},
    )
    form = {"tenant": tenant.pk, "subject": "jane@example.com", "_confirmed": "1"}
    officer.post("/admin/retention/deletionrequest/add/", form)
    waiting = DeletionRequest.objects.get()
    assert waiting.status == "on_hold"
    asked = officer.post(
        "/admin/retention/legalhold/",
        {"action": "lift", "_selected_action": [LegalHold.objects.get().pk]},
    ).content.decode()
    assert f"/admin/retention/deletionrequest/{waiting.pk}/change/" in asked
    assert "Waiting: 1 thread(s) under a legal hold." in asked
