"""Plan review in a real browser, on a real run of the docs' plan agent: the
card numbers the plan's steps (no JSON); a refused change is a form error on
the step's field and decides nothing; a plan approved with a step removed and
an argument edited is carried out exactly so."""

from __future__ import annotations

import pytest

from approvals.models import ApprovalRequest
from tests.approvals.plan_helpers import NOTE, running_plan
from tests.durable.helpers import state, wait_run
from tests.e2e.test_reviewer_desk import PASSWORD, log_in, open_request, resumed_run_id
from tests.factories import make_member, tenant_with_client

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.browser,
    pytest.mark.worker,
]

QUANTITY = "#desk-plan-edit [name=step_1_arg_1]"
SKU = "#desk-plan-edit [name=step_1_arg_0]"


def submit_plan(page, *, quantity: str, note: str = NOTE, drop: int | None = None):
    if not page.locator("#desk-plan-edit").is_visible():
        page.click("#desk-plan-details summary")
    page.fill(QUANTITY, quantity)
    if drop is not None:
        page.uncheck(f"#desk-plan-edit [name=keep_{drop}]")
    page.fill("#desk-plan-edit [name=note]", note)
    page.click("#desk-approve-plan")
    page.wait_for_selector("#desk-card")


def test_plan_card_numbers_the_steps_and_a_changed_plan_runs_as_approved(
    worker, live_server, browser, screenshot_dir
):
    tenant, api = tenant_with_client()
    make_member(tenant, role="reviewer", username="rita", password=PASSWORD)
    running_plan(api, "order-500", amount="80.00", quantity=2)
    page = log_in(browser, live_server, "rita")
    assert "3 steps: reserve_stock, charge_card, notify_customer" in page.inner_text(
        "#result_list"
    )
    open_request(page, "order-500")

    steps = page.locator("#desk-plan-review ol.desk-plan-steps > li")
    assert steps.count() == 3
    assert [steps.nth(i).get_attribute("value") for i in range(3)] == ["1", "2", "3"]
    assert "charge_card" in steps.nth(1).inner_text()
    assert (
        "amount" in steps.nth(1).inner_text() and "80.00" in steps.nth(1).inner_text()
    )
    assert '"steps"' not in page.inner_text("#desk-plan-review")  # a list, not JSON

    submit_plan(page, quantity="500")
    assert "step 1: quantity: Input should be less than or equal to 100" in (
        page.inner_text("#desk-plan-edit")
    )
    submit_plan(page, quantity="1", note="")
    assert "An edit needs a note" in page.inner_text("#desk-plan-edit")
    # The sku is read-only; a page tampered with is refused all the same.
    assert page.get_attribute(SKU, "readonly") is not None
    page.eval_on_selector(SKU, "input => input.removeAttribute('readonly')")
    page.fill(SKU, "OTHER")
    submit_plan(page, quantity="1")
    assert "step 1: sku: sku cannot be edited (editable: quantity)" in (
        page.inner_text("#desk-plan-edit")
    )
    approval = ApprovalRequest.objects.get()
    assert approval.status == "pending" and not approval.decisions.exists()

    page.goto(
        f"{live_server.url}/admin/approvals/approvalrequest/{approval.pk}/change/"
    )
    submit_plan(page, quantity="1", drop=3)
    page.screenshot(path=str(screenshot_dir / "desk-plan-approved.png"), full_page=True)
    assert wait_run(resumed_run_id(page)).status == "succeeded"
    card = page.inner_text("#desk-plan-review")
    assert "step 1 reserve_stock quantity 2 → 1" in card
    assert "step 3 notify_customer removed" in card
    assert [entry["action"] for entry in state(api, "order-500")["done"]] == [
        "reserve_stock",
        "charge_card",
    ]
    assert state(api, "order-500")["done"][0]["args"]["quantity"] == 1
