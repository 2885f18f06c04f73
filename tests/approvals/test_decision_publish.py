"""The decision's resumed run is sent to its worker before the decision's
answer is rendered: the worker waits for the task, the answer's rendering
needs nothing that the commit could change."""

import pytest

from approvals.api import views
from runs import dispatch
from tests.approvals.helpers import waiting_request
from tests.factories import api_client, make_api_key, make_tenant

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("idempotency_key", [None, "decide-once"])
def test_the_resumed_runs_task_is_sent_before_the_answer_is_rendered(
    monkeypatch, idempotency_key
):
    order = []
    monkeypatch.setattr(
        dispatch, "_send", lambda name, args, options: order.append(("sent", name))
    )
    render = views._render

    def rendered(*args, **kwargs):
        order.append(("rendered", None))
        return render(*args, **kwargs)

    monkeypatch.setattr(views, "_render", rendered)
    tenant = make_tenant()
    approval = waiting_request(tenant)
    _, secret = make_api_key(tenant, ["approvals"])
    headers = {"HTTP_IDEMPOTENCY_KEY": idempotency_key} if idempotency_key else {}
    response = api_client(secret).post(
        f"/api/v1/approvals/{approval.pk}/decision",
        {"approved": True, "reviewer": "ops"},
        format="json",
        **headers,
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "approved" and body["resumed_run"]["status"] == "queued"
    assert [d["approved"] for d in body["decisions"]] == [True]
    if idempotency_key is None:
        assert order == [("sent", dispatch.EXECUTE_RUN), ("rendered", None)]
    else:
        # The reservation, the work and the stored answer commit together:
        # the answer is rendered (and stored) before the commit sends the task.
        assert order == [("rendered", None), ("sent", dispatch.EXECUTE_RUN)]
