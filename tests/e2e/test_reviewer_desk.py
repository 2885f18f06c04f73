"""A reviewer at the desk, in a real browser, on real refund runs: the run
that waits on them resumes and finishes when they decide."""

from __future__ import annotations

import re

import pytest

from demo.models import DemoPayment
from tests.approvals.helpers import start_refund, wait_run
from tests.factories import make_member, tenant_with_client

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.browser,
    pytest.mark.worker,
]

PASSWORD = "correct horse battery staple"
QUEUE = "/admin/approvals/approvalrequest/"


def log_in(browser, live_server, username: str, viewport=None):
    context = browser.new_context(
        viewport=viewport or {"width": 1500, "height": 900}, accept_downloads=True
    )
    page = context.new_page()
    page.goto(f"{live_server.url}/admin/login/?next={QUEUE}")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(f"**{QUEUE}")
    return page


def open_request(page, thread_id: str) -> None:
    row = page.locator("#result_list tbody tr", has_text=thread_id)
    row.locator("th.field-action a").click()
    page.wait_for_selector("#desk-card")


def resumed_run_id(page) -> str:
    message = page.locator("ul.messagelist").inner_text()
    return re.search(r"The run resumes \(run ([0-9a-f-]+)\)", message)[1]


def test_reviewer_denies_without_a_note_sees_the_error_then_approves(
    worker, live_server, browser, screenshot_dir
):
    tenant, api = tenant_with_client()
    make_member(tenant, role="reviewer", username="rita", password=PASSWORD)
    cases = [("case-101", "40.00"), ("case-102", "120.00"), ("case-103", "900.00")]
    runs = {
        thread_id: start_refund(
            api, thread_id, order_id=f"A-{thread_id[-3:]}", amount=amount
        )
        for thread_id, amount in cases
    }
    for thread_id, run_id in runs.items():
        wait_run(api, thread_id, run_id, "interrupted")

    page = log_in(browser, live_server, "rita")
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 3
    # Pending first by due time: high risk is due soonest, low risk last.
    assert "case-103" in rows.nth(0).inner_text()
    assert "case-101" in rows.nth(2).inner_text()
    assert "order_id=A-101, amount=40.00, currency=EUR" in rows.nth(2).inner_text()
    # queue.png is taken by test_desk_record, with decided requests in it.

    open_request(page, "case-101")
    card = page.locator("#desk-card")
    assert "arrived damaged" in card.locator("#desk-reason").inner_text()
    assert "40.00 EUR" in card.locator("#desk-affects").inner_text()
    assert "My blender arrived damaged" in page.locator("#desk-context").inner_text()
    page.screenshot(path=str(screenshot_dir / "request.png"), full_page=True)

    page.click("#desk-deny")
    assert "A denial needs a note" in page.locator("#desk-decide").inner_text()
    assert page.locator("#desk-status").inner_text().lower() == "pending"

    page.click("#desk-approve")
    page.wait_for_selector("ul.messagelist")
    assert "Approved." in page.locator("ul.messagelist").inner_text()
    run_id = resumed_run_id(page)

    wait_run(api, "case-101", run_id, "succeeded")
    state = api.get("/api/v1/threads/case-101/state").json()["values"]
    assert state["outcome"] == "refunded"
    assert state["decision"]["reviewer"] == "rita"
    assert DemoPayment.objects.for_tenant(tenant).get().order_id == "A-101"
    approval = api.get("/api/v1/approvals?thread_id=case-101").json()["results"][0]
    assert approval["status"] == "approved"


def test_high_risk_request_needs_a_second_different_reviewer(
    worker, live_server, browser, screenshot_dir
):
    tenant, api = tenant_with_client()
    make_member(tenant, role="reviewer", username="rita", password=PASSWORD)
    make_member(tenant, role="reviewer", username="sam", password=PASSWORD)
    run_id = start_refund(api, "case-900", order_id="A-900", amount="900.00")
    wait_run(api, "case-900", run_id, "interrupted")

    rita = log_in(browser, live_server, "rita")
    open_request(rita, "case-900")
    assert "2 approvals from different reviewers" in rita.inner_text(
        "#desk-two-reviewers"
    )
    rita.click("#desk-approve")
    rita.wait_for_selector("ul.messagelist")
    assert "a second, different reviewer must approve" in rita.inner_text(
        "ul.messagelist"
    )
    assert rita.inner_text("#desk-first-approver") == "rita"
    assert rita.inner_text("#desk-status").lower() == "pending"
    rita.screenshot(path=str(screenshot_dir / "request-high-risk.png"), full_page=True)

    # The same reviewer is not offered Approve again: they wait.
    assert "waiting for a second reviewer" in rita.inner_text("#desk-two-reviewers")
    assert rita.locator("#desk-approve").count() == 0
    assert api.get("/api/v1/threads/case-900").json()["status"] == "interrupted"

    sam = log_in(browser, live_server, "sam")
    open_request(sam, "case-900")
    assert "approved first by" in sam.inner_text("#desk-two-reviewers")
    assert sam.inner_text("#desk-first-approver") == "rita"
    sam.click("#desk-approve")
    sam.wait_for_selector("ul.messagelist")
    assert "Approved." in sam.inner_text("ul.messagelist")

    wait_run(api, "case-900", resumed_run_id(sam), "succeeded")
    assert api.get("/api/v1/threads/case-900/state").json()["values"]["outcome"] == (
        "refunded"
    )
    payment = DemoPayment.objects.for_tenant(tenant).get()
    assert str(payment.amount) == "900.00"
    decisions = api.get("/api/v1/approvals?thread_id=case-900").json()["results"]
    detail = api.get(f"/api/v1/approvals/{decisions[0]['id']}").json()
    assert [d["reviewer"] for d in detail["decisions"]] == ["rita", "sam"]
