"""Edits of a request's arguments over REST: validated against the action's
declaration, with a note, the risk recomputed, the diff shown everywhere."""

import uuid

import pytest
from langgraph.types import Interrupt

from approvals.content import payload_of, resume_value_of
from approvals.models import ApprovalRequest, Decision
from approvals.services import approval_requests_open
from audit.models import AuditEvent
from runs.crypto import ThreadCipher
from runs.models import Run
from runs.signals import InterruptRejected
from tests.approvals.helpers import TESTS, refund_payload, waiting_request
from tests.factories import api_client, make_api_key, make_member, make_tenant

pytestmark = pytest.mark.django_db

NOTE = "One item is kept: refund what came back."


@pytest.fixture
def tenant():
    return make_tenant()


def person(tenant, role="reviewer"):
    """A reviewer's API client through their personal key, and the user."""
    user = make_member(tenant, role=role).user
    _, secret = make_api_key(tenant, ["approvals"], user=user)
    return api_client(secret), user


def decide(client, approval, **body):
    return client.post(
        f"/api/v1/approvals/{approval.pk}/decision",
        {"approved": True, **body},
        format="json",
    )


def edited(approval, **changes):
    """The request's arguments with some changed: an edit sends all of them."""
    return {**payload_of(approval)["args"], **changes}


def assert_untouched(approval):
    approval.refresh_from_db()
    assert approval.status == "pending" and approval.risk == "low"
    assert not Decision.objects.filter(request=approval).exists()
    assert not Run.objects.filter(kind="resume").exists()


def test_edit_with_an_invalid_value_is_400_naming_the_argument(tenant):
    approval = waiting_request(tenant, amount="30.00")
    client, _ = person(tenant)
    response = decide(client, approval, args=edited(approval, amount="abc"), note=NOTE)
    assert response.status_code == 400
    body = response.json()
    assert body["code"] == "invalid"
    assert list(body["fields"]["args"]) == ["amount"]
    assert "decimal" in body["fields"]["args"]["amount"][0]
    assert_untouched(approval)


def test_edit_beyond_the_declared_bounds_is_400(tenant):
    approval = waiting_request(tenant, amount="30.00")
    client, _ = person(tenant)
    response = decide(client, approval, args=edited(approval, amount="-5"), note=NOTE)
    assert response.status_code == 400
    assert "greater than 0" in response.json()["fields"]["args"]["amount"][0]
    assert_untouched(approval)


def test_edit_of_a_non_editable_argument_is_400(tenant):
    approval = waiting_request(tenant, amount="30.00")
    client, _ = person(tenant)
    response = decide(
        client, approval, args=edited(approval, order_id="A-9999"), note=NOTE
    )
    assert response.status_code == 400
    message = response.json()["fields"]["args"]["order_id"][0]
    assert message == "order_id cannot be edited (editable: amount)"
    assert_untouched(approval)


def test_edit_without_a_note_is_400_naming_the_note(tenant):
    approval = waiting_request(tenant, amount="30.00")
    client, _ = person(tenant)
    response = decide(client, approval, args=edited(approval, amount="20.00"))
    assert response.status_code == 400
    assert "needs a note" in response.json()["fields"]["note"][0]
    assert_untouched(approval)


def test_edit_that_raises_the_risk_waits_for_a_second_reviewer_who_sees_it(tenant):
    approval = waiting_request(tenant, amount="30.00")
    assert (approval.risk, approval.required_approvals) == ("low", 1)
    first, alice = person(tenant)
    response = decide(
        first, approval, args=edited(approval, amount="900.00"), note=NOTE
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "pending" and body["resumed_run"] is None
    assert (body["risk"], body["required_approvals"]) == ("high", 2)
    assert body["payload"]["args"]["amount"] == "30.00"  # what the agent asked
    assert body["args"]["amount"] == "900.00"  # what an approval approves now
    diff = [{"arg": "amount", "old": "30.00", "new": "900.00"}]
    assert body["edits"] == diff
    assert body["decisions"][0]["edits"] == diff

    again = decide(first, approval)
    assert again.status_code == 409 and again.json()["code"] == "same_reviewer"

    second, bob = person(tenant)
    seen = second.get(f"/api/v1/approvals/{approval.pk}").json()
    assert seen["edits"] == diff and seen["args"]["amount"] == "900.00"
    settled = decide(second, approval)
    assert settled.status_code == 200, settled.content
    assert settled.json()["status"] == "approved"

    approval.refresh_from_db()
    resume = resume_value_of(approval, ThreadCipher.for_thread(approval.thread))
    assert resume["args"]["amount"] == "900.00" and resume["edits"] == diff
    summaries = list(
        AuditEvent.objects.for_tenant(tenant)
        .filter(kind="approval.decided")
        .order_by("seq")
        .values_list("summary", flat=True)
    )
    assert summaries == [
        f"refund_order approved (1 of 2) by {alice.username}; edited amount "
        "30.00 → 900.00 (now high risk)",
        f"refund_order approved by {bob.username}",
    ]


def test_an_edit_down_does_not_lower_the_approvals_needed(tenant):
    approval = waiting_request(tenant, amount="900.00")
    client, _ = person(tenant)
    response = decide(
        client, approval, args=edited(approval, amount="20.00"), note=NOTE
    )
    body = response.json()
    assert body["status"] == "pending"
    assert (body["risk"], body["required_approvals"]) == ("high", 2)


def test_an_approval_of_the_old_arguments_does_not_count_for_an_edit(tenant):
    """Two approvals are counted for the arguments that will be executed."""
    approval = waiting_request(tenant, amount="900.00")
    first, _ = person(tenant)
    second, _ = person(tenant)
    assert decide(first, approval).json()["status"] == "pending"
    response = decide(
        second, approval, args=edited(approval, amount="800.00"), note=NOTE
    )
    assert response.json()["status"] == "pending"  # only the editor approved 800
    settled = decide(first, approval)  # the first reviewer, on the new amount
    assert settled.json()["status"] == "approved"


def test_an_action_without_an_argument_schema_cannot_be_edited(tenant):
    from runs.services import thread_create

    thread = thread_create(tenant=tenant, agent="gate", actor=TESTS)
    thread.agent_version = "1"
    thread.save()
    run = Run.objects.create(
        tenant=tenant,
        thread=thread,
        kind="start",
        status="interrupted",
        agent_version="1",
    )
    payload = {**refund_payload("A-1", "10.00"), "action": "do_one"}
    (approval,) = approval_requests_open(
        run=run, interrupts=[Interrupt(value=payload, id=uuid.uuid4().hex)]
    )
    client, _ = person(tenant)
    response = decide(client, approval, args={"anything": 1}, note=NOTE)
    assert response.status_code == 400
    assert "cannot be edited" in response.json()["fields"]["args"][0]


def test_a_gate_whose_arguments_break_the_declared_schema_fails_the_run(tenant):
    approval = waiting_request(tenant)
    payload = refund_payload("A-2", "10.00")
    payload["args"]["amount"] = "abc"
    with pytest.raises(InterruptRejected, match="amount"):
        approval_requests_open(
            run=approval.run,
            interrupts=[Interrupt(value=payload, id=uuid.uuid4().hex)],
        )
    assert ApprovalRequest.objects.count() == 1


def test_the_declared_risk_rule_sets_the_risk_of_a_request(tenant):
    """The agent says low; its own declared rule says 900.00 is high."""
    approval = waiting_request(tenant)
    payload = {**refund_payload("A-3", "900.00"), "risk": "low"}
    (request,) = approval_requests_open(
        run=approval.run,
        interrupts=[Interrupt(value=payload, id=uuid.uuid4().hex)],
    )
    assert (request.risk, request.required_approvals) == ("high", 2)
