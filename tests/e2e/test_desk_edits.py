"""Approve with edited arguments, in a real browser, on real refund runs: what
the agent declares decides what may change; an edit that raises the risk
waits for a second reviewer, who sees it, and only then does money move."""

from __future__ import annotations

import pytest

from approvals.models import ApprovalRequest
from audit.models import AuditEvent
from demo.models import DemoPayment
from tests.approvals.helpers import start_refund, wait_run
from tests.e2e.test_reviewer_desk import PASSWORD, log_in, open_request, resumed_run_id
from tests.factories import make_member, tenant_with_client

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.browser,
    pytest.mark.worker,
]

NOTE = "One item is kept: refund what came back."
# The refund's arguments, in the edit form's order.
ORDER_ID, AMOUNT = "#desk-edit [name=arg_0]", "#desk-edit [name=arg_1]"


def submit_edit(page, *, amount: str, note: str = NOTE) -> None:
    if not page.locator("#desk-edit").is_visible():
        page.click("#desk-edit-details summary")
    page.fill(AMOUNT, amount)
    page.fill("#desk-edit [name=note]", note)
    page.click("#desk-approve-edited")
    page.wait_for_selector("#desk-card")


def waiting_refund(thread_id: str, amount: str):
    tenant, api = tenant_with_client()
    run_id = start_refund(api, thread_id, order_id="A-300", amount=amount)
    wait_run(api, thread_id, run_id, "interrupted")
    return tenant, api


def test_refused_edits_are_form_errors_and_decide_nothing(worker, live_server, browser):
    tenant, api = waiting_refund("case-300", "30.00")
    make_member(tenant, role="reviewer", username="rita", password=PASSWORD)
    page = log_in(browser, live_server, "rita")
    open_request(page, "case-300")

    submit_edit(page, amount="abc")
    assert "amount: Input should be a valid decimal" in page.inner_text("#desk-edit")

    submit_edit(page, amount="20.00", note="")
    assert "An edit needs a note" in page.inner_text("#desk-edit")

    # The order id is read-only; a page tampered with is refused all the same.
    assert page.get_attribute(ORDER_ID, "readonly") is not None
    page.eval_on_selector(ORDER_ID, "input => input.removeAttribute('readonly')")
    page.fill(ORDER_ID, "A-9999")
    submit_edit(page, amount="20.00")
    assert "order_id cannot be edited (editable: amount)" in page.inner_text(
        "#desk-edit"
    )

    assert page.inner_text("#desk-status").lower() == "pending"
    approval = ApprovalRequest.objects.get()
    assert approval.status == "pending" and not approval.decisions.exists()
    assert not DemoPayment.objects.exists()
    assert api.get("/api/v1/threads/case-300").json()["status"] == "interrupted"


def test_an_edit_that_raises_the_risk_waits_for_a_second_reviewer(
    worker, live_server, browser, screenshot_dir
):
    tenant, api = waiting_refund("case-301", "30.00")
    make_member(tenant, role="reviewer", username="rita", password=PASSWORD)
    make_member(tenant, role="reviewer", username="sam", password=PASSWORD)

    rita = log_in(browser, live_server, "rita")
    open_request(rita, "case-301")
    assert "low risk" in rita.inner_text("#desk-card h2").lower()
    submit_edit(rita, amount="900.00")
    assert "a second, different reviewer must approve" in rita.inner_text(
        "ul.messagelist"
    )
    assert "high risk" in rita.inner_text("#desk-card h2").lower()
    assert not DemoPayment.objects.exists()

    sam = log_in(browser, live_server, "sam")
    open_request(sam, "case-301")
    assert "amount 30.00 → 900.00" in sam.inner_text("#desk-edited")
    assert "rita" in sam.inner_text("#desk-first-approver")
    sam.screenshot(path=str(screenshot_dir / "request-edited.png"), full_page=True)
    sam.click("#desk-approve")
    sam.wait_for_selector("ul.messagelist")
    assert "Approved." in sam.inner_text("ul.messagelist")

    wait_run(api, "case-301", resumed_run_id(sam), "succeeded")
    assert str(DemoPayment.objects.for_tenant(tenant).get().amount) == "900.00"
    summaries = AuditEvent.objects.for_tenant(tenant).filter(kind="approval.decided")
    assert [event.summary for event in summaries.order_by("seq")] == [
        "refund_order approved (1 of 2) by rita; edited amount 30.00 → 900.00 "
        "(now high risk)",
        "refund_order approved by sam",
    ]
