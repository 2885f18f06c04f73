"""The desk as a record, in a real browser on real refund runs: the queue on a
1400 px screen, its filters and CSV export; a decided card that says who
decided and what became of the run; and the links between a request, its
thread and the thread's audit timeline, both ways."""

from __future__ import annotations

import csv
import io

import pytest

from approvals.models import ApprovalRequest
from approvals.services import Reviewer, approval_decide
from demo.models import DemoPayment
from tests.approvals.helpers import start_refund, wait_run
from tests.e2e.test_reviewer_desk import (
    PASSWORD,
    QUEUE,
    log_in,
    open_request,
    resumed_run_id,
)
from tests.factories import make_member, make_tenant, tenant_with_client

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.browser,
    pytest.mark.worker,
]

SCREEN = {"width": 1400, "height": 900}
# The runs execute on a worker of a machine that may be busy.
RUN_TIMEOUT = 90


def refunds_waiting(api, cases: dict[str, str]) -> None:
    runs = {
        thread_id: start_refund(
            api, thread_id, order_id=f"A-{thread_id[-3:]}", amount=amount
        )
        for thread_id, amount in cases.items()
    }
    for thread_id, run_id in runs.items():
        wait_run(api, thread_id, run_id, "interrupted", timeout=RUN_TIMEOUT)


def decide(api, thread_id: str, user, *, approved: bool, note: str = ""):
    """Decide as `user` through the service the desk and the API share; the
    resumed run, if the decision settled the request."""
    approval = ApprovalRequest.objects.get(thread__thread_id=thread_id)
    _, run = approval_decide(
        approval=approval,
        reviewer=Reviewer.for_user(user),
        approved=approved,
        note=note,
    )
    return run


def test_the_queue_fits_1400_px_and_exports_what_it_filters(
    worker, live_server, browser, screenshot_dir
):
    tenant, api = tenant_with_client()
    rita = make_member(tenant, role="reviewer", username="rita", password=PASSWORD)
    make_member(tenant, role="reviewer", username="sam", password=PASSWORD)
    # Sam reviews for a second tenant too: the queue shows its tenant column.
    make_member(make_tenant(), role="reviewer", username="sam", password=PASSWORD)
    refunds_waiting(
        api,
        {
            "case-2024-11-refund-401": "40.00",
            "case-2024-11-refund-402": "120.00",
            "case-2024-11-refund-403": "900.00",
            "case-2024-11-refund-404": "75.00",
        },
    )
    approved = decide(api, "case-2024-11-refund-401", rita.user, approved=True)
    denied = decide(
        api, "case-2024-11-refund-402", rita.user, approved=False, note="Not ours."
    )
    decide(api, "case-2024-11-refund-403", rita.user, approved=True)  # 1 of 2
    wait_run(
        api,
        "case-2024-11-refund-401",
        str(approved.pk),
        "succeeded",
        timeout=RUN_TIMEOUT,
    )
    wait_run(
        api, "case-2024-11-refund-402", str(denied.pk), "succeeded", timeout=RUN_TIMEOUT
    )

    page = log_in(browser, live_server, "sam", SCREEN)
    page.screenshot(path=str(screenshot_dir / "queue.png"), full_page=True)
    # Nothing scrolls sideways: neither the page nor the table in its box.
    assert page.evaluate("document.documentElement.scrollWidth") <= SCREEN["width"]
    results = page.locator("#changelist-form .results")
    assert results.evaluate("box => box.scrollWidth <= box.clientWidth")
    header = page.locator("#result_list thead").inner_text().lower()
    for column in (
        "risk",
        "status",
        "level",
        "assigned to",
        "decided by",
        "decided at",
    ):
        assert column in header
    assert page.locator("h1").inner_text() == "Approval requests"

    # Filter by reviewer and decision: what rita denied.
    page.click("#changelist-filter a:text-is('rita')")
    page.click("#changelist-filter a:text-is('Denied')")
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 1
    assert "case-2024-11-refund-402" in rows.nth(0).inner_text()
    assert "rita" in rows.nth(0).locator("td.field-decided_by").inner_text()

    with page.expect_download() as download:
        page.click("#queue-export")
    body = io.StringIO(open(download.value.path(), encoding="utf-8").read())
    exported = list(csv.DictReader(body))
    assert [row["thread_id"] for row in exported] == ["case-2024-11-refund-402"]
    assert exported[0]["decisions"] == "rita denied"
    assert "Not ours." not in body.getvalue()

    # An order id finds its request.
    page.goto(f"{live_server.url}{QUEUE}")
    page.fill("#searchbar", "A-404")
    page.press("#searchbar", "Enter")
    page.wait_for_selector("#result_list")
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 1
    assert "case-2024-11-refund-404" in rows.nth(0).inner_text()
    assert DemoPayment.objects.for_tenant(tenant).count() == 1


def test_a_decided_card_says_who_decided_and_what_became_of_the_run_and_links_both_ways(
    worker, live_server, browser, screenshot_dir
):
    tenant, api = tenant_with_client()
    make_member(tenant, role="compliance_officer", username="olga", password=PASSWORD)
    refunds_waiting(api, {"case-501": "40.00"})

    page = log_in(browser, live_server, "olga", {"width": 1400, "height": 1000})
    open_request(page, "case-501")
    page.fill("#desk-decide [name=note]", "Photo of the damage attached to the case.")
    page.click("#desk-approve")
    page.wait_for_selector("ul.messagelist")
    run_id = resumed_run_id(page)
    wait_run(api, "case-501", run_id, "succeeded", timeout=RUN_TIMEOUT)

    page.reload()
    assert page.inner_text("#desk-decider") == "olga"
    assert page.inner_text("#desk-decision-outcome").startswith("Approved by olga at ")
    assert "It resumed and succeeded." in page.inner_text("#desk-run-outcome")
    payment = DemoPayment.objects.for_tenant(tenant).get()
    assert f"payment_id=pay_{payment.pk}" in page.inner_text("#desk-effects")
    card = page.inner_text("#desk-card")
    assert "Waiting for" not in card and "Escalates" not in card
    # The customer's message reads as text, not as the JSON the agent built.
    context = page.inner_text("#desk-context")
    assert "customer_message: My blender arrived damaged" in context
    assert '{"customer_message"' not in context
    page.screenshot(path=str(screenshot_dir / "request-decided.png"), full_page=True)

    # Request -> thread: its requests, with their decisions and deciders.
    page.click("#desk-thread-link")
    page.wait_for_selector("#thread-approvals")
    assert "approved by olga" in page.inner_text("#thread-approvals")
    page.screenshot(path=str(screenshot_dir / "thread.png"), full_page=True)

    # Thread -> its audit timeline, a story a person reads.
    page.click("#thread-timeline-link")
    page.wait_for_selector("#audit-timeline")
    story = page.inner_text("#audit-timeline")
    assert "refund_order approved by olga" in story
    assert "payments.refund succeeded" in story
    page.screenshot(path=str(screenshot_dir / "audit-timeline.png"), full_page=True)

    # And back: timeline -> request, timeline -> thread.
    page.click("a.timeline-request-link >> nth=0")
    page.wait_for_selector("#desk-card")
    assert page.inner_text("#desk-decider") == "olga"
    page.go_back()
    page.click("#timeline-thread-link")
    page.wait_for_selector("#thread-approvals")
    page.click("#thread-approvals a.thread-approval-link")
    page.wait_for_selector("#desk-card")
    assert "case-501" in page.inner_text("#desk-card")
