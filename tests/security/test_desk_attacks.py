"""Attacks on what an approval means, on the reviewer's desk: an approval
counts only for what its reviewer was shown."""

import pytest

from approvals.models import Decision
from tests.approvals.helpers import decide_url, logged_in, open_card, waiting_request
from tests.factories import make_member, make_tenant

pytestmark = pytest.mark.django_db


def test_an_approval_from_a_page_opened_before_an_edit_does_not_approve_the_edit():
    """Alice opens a 30.00 refund (low risk, one approval). Bob edits it to
    900.00 (high risk, two approvals) and approves: one of two. Alice, still
    on her page showing 30.00, approves: that must not be the second approval
    of 900.00, which she never saw."""
    tenant = make_tenant()
    approval = waiting_request(tenant, amount="30.00")
    alice = logged_in(make_member(tenant, username="alice").user)
    _, alice_opening = open_card(alice, approval)
    bob = logged_in(make_member(tenant, username="bob").user)
    page, bob_opening = open_card(bob, approval)
    form = page.context["edit_form"]
    edit = {field.html_name: field.value() for field in form.arg_fields()}
    amount = next(f.html_name for f in form.arg_fields() if f.label == "amount")
    edit.update({amount: "900.00", "form": "edit", "opening": bob_opening})
    edit["note"] = "The customer also returned the second item."
    assert bob.post(decide_url(approval), edit).status_code == 302

    response = alice.post(
        decide_url(approval),
        {"verdict": "approve", "opening": alice_opening},
        follow=True,
    )

    approval.refresh_from_db()
    assert (approval.status, approval.required_approvals) == ("pending", 2)
    assert not Decision.objects.filter(reviewer_user__username="alice").exists()
    html = response.content.decode()
    assert "changed since you opened it" in html
    assert "amount 30.00 → 900.00" in html
