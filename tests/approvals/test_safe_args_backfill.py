"""approvals 0007 fills the safe arguments of the requests opened before
0006 kept them, so that the queue's search finds those by order id too;
what it cannot read it leaves, without failing the migration."""

from __future__ import annotations

import pytest

from approvals.content import payload_of
from approvals.models import ApprovalRequest
from approvals.services import Reviewer, approval_decide
from runs import storage
from tests.approvals.helpers import listed, logged_in, waiting_request
from tests.factories import make_member, make_tenant
from tests.migrations import migrate_to, migrate_to_latest

pytestmark = pytest.mark.django_db

# Back to 0006 and forward again runs 0007 over the rows as they are.
BEFORE = [("approvals", "0006_safe_args")]


def opened_before_0006(*requests: ApprovalRequest) -> None:
    """The requests as 0006 found them: no safe arguments in clear."""
    ApprovalRequest.objects.filter(pk__in=[r.pk for r in requests]).update(safe_args="")


def order_id(request: ApprovalRequest) -> str:
    return payload_of(request)["args"]["order_id"]


@pytest.fixture
def tenant():
    return make_tenant()


@pytest.fixture
def reviewer(tenant):
    return make_member(tenant, role="reviewer", username="rita").user


def test_requests_opened_before_0006_are_found_by_order_id(tenant, reviewer):
    old = waiting_request(tenant, thread_id="case-old")
    waiting_request(tenant, thread_id="case-other")
    opened_before_0006(old)
    client = logged_in(reviewer)
    migrate_to(BEFORE)
    assert listed(client, f"?q={order_id(old)}") == []

    migrate_to_latest()

    old.refresh_from_db()
    assert old.safe_args == f"order_id={order_id(old)} amount=40.00 currency=EUR"
    assert listed(client, f"?q={order_id(old)}") == ["case-old"]


def test_an_edited_request_is_found_by_what_it_would_now_execute(tenant, reviewer):
    edited = waiting_request(tenant, thread_id="case-edited")
    args = {**payload_of(edited)["args"], "amount": "35.00"}
    approval_decide(
        approval=edited,
        reviewer=Reviewer.for_user(reviewer),
        approved=True,
        note="one item is kept",
        args=args,
    )
    opened_before_0006(edited)
    migrate_to(BEFORE)

    migrate_to_latest()

    edited.refresh_from_db()
    assert edited.safe_args == f"order_id={order_id(edited)} amount=35.00 currency=EUR"


def test_what_cannot_be_read_is_skipped_and_the_rest_filled(tenant, reviewer):
    shredded = waiting_request(tenant, thread_id="case-shredded")
    cleared = waiting_request(tenant, thread_id="case-cleared")
    unregistered = waiting_request(tenant, thread_id="case-unregistered")
    readable = waiting_request(tenant, thread_id="case-readable")
    shredded_order = order_id(shredded)
    opened_before_0006(shredded, cleared, unregistered, readable)
    storage.threads_shred(thread_pks=[shredded.thread_id])
    ApprovalRequest.objects.filter(pk=cleared.pk).update(payload=b"")
    unregistered.thread.agent_version = "retired"
    unregistered.thread.save(update_fields=["agent_version"])
    migrate_to(BEFORE)

    migrate_to_latest()

    left = ApprovalRequest.objects.filter(safe_args="").values_list(
        "thread__thread_id", flat=True
    )
    assert sorted(left) == ["case-cleared", "case-shredded", "case-unregistered"]
    client = logged_in(reviewer)
    assert listed(client, f"?q={shredded_order}") == []
    assert listed(client, f"?q={order_id(readable)}") == ["case-readable"]
