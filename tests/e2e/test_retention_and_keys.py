"""The compliance officer's and the tenant admin's pages, in a real browser: a
deletion request is confirmed on a page that lists what it would delete (an
open approval included), and a new API key's page, reloaded, makes no second
key and shows the secret no more."""

from __future__ import annotations

import pytest

from approvals.models import ApprovalRequest
from retention.models import DeletionRequest
from runs.models import ApiKey, Thread
from tests.approvals.helpers import refund_input, wait_run
from tests.e2e.test_reviewer_desk import PASSWORD, log_in
from tests.factories import make_member, make_tenant, tenant_with_client

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]

JANE = "jane@example.com"


def log_in_at(browser, live_server, username: str, path: str):
    """Signed in (through the desk's login), on `path`."""
    page = log_in(browser, live_server, username)
    page.goto(f"{live_server.url}{path}")
    return page


def janes_refund(api, thread_id: str) -> str:
    """A refund thread of Jane's, started; the run's id."""
    created = api.post(
        "/api/v1/threads",
        {"thread_id": thread_id, "agent": "refund", "metadata": {"subject": JANE}},
        format="json",
    )
    assert created.status_code == 201, created.content
    started = api.post(
        f"/api/v1/threads/{thread_id}/runs",
        {"input": refund_input(order_id="A-2077", amount="120.00")},
        format="json",
    )
    assert started.status_code == 202, started.content
    return started.json()["run_id"]


@pytest.mark.worker
def test_a_deletion_is_confirmed_on_a_page_listing_the_open_approval(
    worker, live_server, browser, screenshot_dir
):
    tenant, api = tenant_with_client()
    run_id = janes_refund(api, "case-77")
    wait_run(api, "case-77", run_id, "interrupted")
    api.post(
        "/api/v1/threads",
        {"thread_id": "case-78", "agent": "refund", "metadata": {"subject": JANE}},
        format="json",
    )
    approval = ApprovalRequest.objects.get(thread__thread_id="case-77")
    make_member(tenant, role="compliance_officer", username="cora", password=PASSWORD)

    add = "/admin/retention/deletionrequest/add/"
    page = log_in_at(browser, live_server, "cora", add)
    # Her only tenant is chosen already.
    assert page.eval_on_selector("#id_tenant", "select => select.value") == str(
        tenant.pk
    )
    page.fill("#id_subject", JANE)
    page.click("#deletionrequest-form input[type=submit]")
    page.wait_for_selector("#matched-threads")

    threads = page.inner_text("#matched-threads")
    assert "case-77" in threads and "case-78" in threads
    approvals = page.inner_text("#open-approvals")
    assert "refund_order" in approvals and "Medium" in approvals
    link = page.get_attribute("#open-approvals a", "href")
    assert link == f"/admin/approvals/approvalrequest/{approval.pk}/change/"
    assert "2 thread(s)" in page.inner_text(".deletion-confirmation")
    # Nothing has changed yet.
    assert not DeletionRequest.objects.exists()
    assert Thread.objects.get(thread_id="case-77").wrapped_data_key is not None
    page.screenshot(
        path=str(screenshot_dir / "deletion-confirmation.png"), full_page=True
    )

    page.click("#confirm-deletion input[type=submit]")
    page.wait_for_selector("ul.messagelist")
    assert "Deletion requested" in page.inner_text("ul.messagelist")
    request = DeletionRequest.objects.get()
    assert request.kind == "subject" and request.record["threads_found"] == 2
    approval.refresh_from_db()
    assert approval.status != "pending"
    assert JANE not in page.content()


def test_the_new_keys_page_reloaded_makes_no_second_key(live_server, browser):
    tenant = make_tenant()
    make_member(tenant, role="tenant_admin", username="tia", password=PASSWORD)
    add = "/admin/runs/apikey/add/"
    page = log_in_at(browser, live_server, "tia", add)
    page.fill("#id_name", "billing")
    page.check("input[name=scopes][value=runs]")
    page.click("input[name=_save]")
    page.wait_for_selector("#api-key-created")
    secret = page.inner_text("#api-key-secret")
    assert secret.startswith("gh_")
    assert "Scopes: Runs" in page.inner_text("#api-key-created")

    page.reload()
    page.wait_for_selector("#api-key-created")
    assert page.locator("#api-key-secret").count() == 0
    assert "cannot be shown again" in page.inner_text("#api-key-secret-gone")
    assert secret not in page.content()
    (api_key,) = ApiKey.objects.all()
    assert api_key.name == "billing" and api_key.matches(secret)

    # Back to the form and the same name: refused, still one key.
    page.goto(f"{live_server.url}{add}")
    page.fill("#id_name", "billing")
    page.check("input[name=scopes][value=runs]")
    page.click("input[name=_save]")
    assert "already has a key named 'billing'" in page.inner_text("#content")
    assert ApiKey.objects.count() == 1
