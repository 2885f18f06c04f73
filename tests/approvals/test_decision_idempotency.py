"""The decision endpoint honours Idempotency-Key: a retried decision is the
first one, replayed; never a second decision."""

import pytest

from approvals.models import Decision
from runs.models import Run
from tests.approvals.helpers import waiting_request
from tests.factories import api_client, make_api_key, make_member, make_tenant

pytestmark = pytest.mark.django_db


def test_a_retried_decision_replays_the_first_response():
    tenant = make_tenant()
    approval = waiting_request(tenant)
    _, secret = make_api_key(tenant, ["approvals"])
    client = api_client(secret)
    url = f"/api/v1/approvals/{approval.pk}/decision"
    body = {"approved": True, "note": "Photo checked."}
    first = client.post(url, body, format="json", HTTP_IDEMPOTENCY_KEY="decide-1")
    again = client.post(url, body, format="json", HTTP_IDEMPOTENCY_KEY="decide-1")
    assert first.status_code == again.status_code == 200
    assert again["Idempotent-Replayed"] == "true"
    assert again.json() == first.json()
    assert Decision.objects.count() == 1
    assert Run.objects.filter(kind="resume").count() == 1


def test_the_same_key_with_another_body_is_409_and_another_caller_has_its_own():
    tenant = make_tenant()
    approval = waiting_request(tenant, amount="900.00")
    _, own = make_api_key(tenant, ["approvals"], user=make_member(tenant).user)
    _, other = make_api_key(tenant, ["approvals"], user=make_member(tenant).user)
    url = f"/api/v1/approvals/{approval.pk}/decision"
    body = {"approved": True}
    key = {"HTTP_IDEMPOTENCY_KEY": "decide-2"}
    assert api_client(own).post(url, body, format="json", **key).status_code == 200
    changed = api_client(own).post(
        url, {"approved": False, "note": "no"}, format="json", **key
    )
    assert changed.status_code == 409
    assert changed.json()["code"] == "idempotency_key_reused"
    # A second reviewer's key is their own: their decision is not a replay of
    # the first reviewer's.
    second = api_client(other).post(url, body, format="json", **key)
    assert second.status_code == 200 and "Idempotent-Replayed" not in second
    assert second.json()["status"] == "approved"
    assert Decision.objects.count() == 2
