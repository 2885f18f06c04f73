"""The approval gate holds on every path that changes a thread's state: raw
resume, fork or state update, a run from a checkpoint, the admin, a service
called directly (management commands, the Agent Protocol API). Executed by a
real worker against the refund agent and its demo payments provider."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from approvals.models import ApprovalRequest
from audit.models import AuditEvent
from audit.services import Actor
from demo.models import DemoPayment
from runs import services
from runs.errors import ApprovalRequired
from runs.models import Run, Thread
from tests.approvals.helpers import refund_input, start_refund, wait_run
from tests.factories import api_client, make_api_key, make_member, make_tenant

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

APPROVED = {"approved": True, "note": "", "reviewer": "me", "args": {}}
# State values that write an approving decision.
APPROVING = {"decision": {"approved": True}}


def key_client(tenant, scopes) -> APIClient:
    return api_client(make_api_key(tenant, scopes)[1])


def session_client(tenant, role) -> APIClient:
    client = APIClient()
    client.force_login(make_member(tenant, role=role).user)
    return client


def waiting_refund(tenant, thread_id="case-1", amount="1299.00"):
    """A refund thread stopped at its gate: (the request, the interrupt id)."""
    client = key_client(tenant, ["runs"])
    run_id = start_refund(client, thread_id, amount=amount)
    wait_run(client, thread_id, run_id, "interrupted")
    request = ApprovalRequest.objects.get(thread__thread_id=thread_id)
    return request, request.interrupt_id


def checkpoint_where(client, thread_id, next_nodes):
    history = client.get(f"/api/v1/threads/{thread_id}/history").json()["results"]
    return next(e["checkpoint_id"] for e in history if e["next"] == next_nodes)


def fork(client, checkpoint_id, values, as_node=None):
    body = {"checkpoint_id": checkpoint_id, "values": values}
    if as_node is not None:
        body["as_node"] = as_node
    return client.post("/api/v1/threads/case-1/fork", body, format="json")


def assert_gate_held(request, tenant):
    """Nothing moved: no payment, the request pending, the thread waiting."""
    request.refresh_from_db()
    assert request.status == "pending"
    assert not request.decisions.exists()
    assert not DemoPayment.objects.for_tenant(tenant).exists()
    assert Thread.objects.get(pk=request.thread_id).status == "interrupted"
    assert not Run.objects.filter(thread_id=request.thread_id, kind="resume").exists()


def assert_approval_required(response, *, naming=None):
    assert response.status_code == 409, response.content
    body = response.json()
    assert body["code"] == "approval_required", body
    if naming is not None:
        assert body["pending_approvals"] == [str(naming.pk)]
    return body


# --- 1. Raw resume -----------------------------------------------------------------


def test_raw_resume_of_a_gate_is_refused_naming_its_request(worker):
    tenant = make_tenant()
    request, _ = waiting_refund(tenant)
    response = key_client(tenant, ["runs"]).post(
        "/api/v1/threads/case-1/resume",
        {"resume": {"approved": True}},
        format="json",
    )
    body = assert_approval_required(response, naming=request)
    assert str(request.pk) in body["message"]
    assert_gate_held(request, tenant)


def test_raw_resume_keyed_by_the_gates_interrupt_id_is_refused(worker):
    tenant = make_tenant()
    request, interrupt_id = waiting_refund(tenant)
    response = key_client(tenant, ["runs"]).post(
        "/api/v1/threads/case-1/resume",
        {"resume": {interrupt_id: {**APPROVED, "approval_id": str(request.pk)}}},
        format="json",
    )
    assert_approval_required(response, naming=request)
    assert_gate_held(request, tenant)


def test_a_service_called_directly_cannot_resume_a_gate(worker):
    """What a management command or the Agent Protocol API would call."""
    tenant = make_tenant()
    request, interrupt_id = waiting_refund(tenant)
    with pytest.raises(ApprovalRequired) as refused:
        services.run_resume(
            thread=request.thread,
            resume={interrupt_id: APPROVED},
            actor=Actor.system("manage.py"),
            behind_active_run=True,
        )
    assert refused.value.approval_ids == [str(request.pk)]
    assert_gate_held(request, tenant)


def test_a_value_given_as_settled_opens_no_gate_the_thread_does_not_wait_on(worker):
    """`settled` (a decision's own value, not read back) names interrupts;
    one the thread does not wait on makes the value a raw resume of the
    gate it does wait on, which is refused."""
    tenant = make_tenant()
    request, _ = waiting_refund(tenant)
    elsewhere = {"0" * 32: {**APPROVED, "approval_id": str(request.pk)}}
    with pytest.raises(ApprovalRequired) as refused:
        services.run_resume(
            thread=request.thread,
            resume=elsewhere,
            actor=Actor.system("manage.py"),
            behind_active_run=True,
            settled=elsewhere,
        )
    assert refused.value.approval_ids == [str(request.pk)]
    assert_gate_held(request, tenant)


def test_a_decision_resumes_its_gate_without_reading_its_value_back(worker):
    """The decision settles the request and resumes the gate in one
    transaction: the request is read once (locked), the checkpoint's pending
    interrupts are checked, and the run gets past the gate."""
    tenant = make_tenant()
    request, _ = waiting_refund(tenant, amount="40.00")  # one approval settles it
    client = key_client(tenant, ["approvals", "runs"])
    with CaptureQueriesContext(connection) as captured:
        decided = client.post(
            f"/api/v1/approvals/{request.pk}/decision",
            {"approved": True, "reviewer": "ops"},
            format="json",
        )
    assert decided.status_code == 200, decided.content
    reads = [
        q["sql"]
        for q in captured.captured_queries
        if q["sql"].startswith("SELECT")
        and 'FROM "approvals_approvalrequest"' in q["sql"]
    ]
    assert len(reads) == 1, reads
    run_id = decided.json()["resumed_run"]["run_id"]
    wait_run(client, "case-1", run_id, "succeeded")
    assert DemoPayment.objects.for_tenant(tenant).count() == 1


def test_raw_resume_of_an_input_interrupt_resumes_it(worker):
    tenant = make_tenant()
    client = key_client(tenant, ["runs"])
    client.post("/api/v1/threads", {"thread_id": "q1", "agent": "ask"}, format="json")
    run_id = client.post(
        "/api/v1/threads/q1/runs", {"input": {}}, format="json"
    ).json()["run_id"]
    wait_run(client, "q1", run_id, "interrupted")
    assert not ApprovalRequest.objects.exists()  # a question, not a gate
    response = client.post(
        "/api/v1/threads/q1/resume", {"resume": "A-1001"}, format="json"
    )
    assert response.status_code == 202, response.content
    wait_run(client, "q1", response.json()["run_id"], "succeeded")
    state = client.get("/api/v1/threads/q1/state").json()
    assert state["values"]["answer"] == "A-1001"


# --- 2. Time travel ----------------------------------------------------------------


def test_fork_writing_a_decision_as_the_gate_node_is_refused(worker):
    """The issue's attack: fork from the interrupted checkpoint as
    request_approval with an approving decision."""
    tenant = make_tenant()
    request, _ = waiting_refund(tenant)
    client = key_client(tenant, ["runs", "time_travel"])
    at_gate = checkpoint_where(client, "case-1", ["request_approval"])
    before = len(client.get("/api/v1/threads/case-1/history").json()["results"])
    response = fork(client, at_gate, APPROVING, as_node="request_approval")
    assert_approval_required(response, naming=request)
    after = client.get("/api/v1/threads/case-1/history").json()["results"]
    assert len(after) == before
    assert after[0]["next"] == ["request_approval"]
    assert_gate_held(request, tenant)


def test_fork_of_a_thread_with_an_open_request_is_refused(worker):
    tenant = make_tenant()
    request, _ = waiting_refund(tenant)
    client = key_client(tenant, ["runs", "time_travel"])
    first = checkpoint_where(client, "case-1", ["read_request"])
    response = fork(client, first, {"customer_message": "changed"})
    assert_approval_required(response, naming=request)
    assert_gate_held(request, tenant)


def _denied_refund(tenant):
    """A refund whose request was denied: no open request on the thread."""
    request, _ = waiting_refund(tenant)
    client = key_client(tenant, ["runs", "approvals"])
    decided = client.post(
        f"/api/v1/approvals/{request.pk}/decision",
        {"approved": False, "note": "Outside the refund window."},
        format="json",
    )
    wait_run(client, "case-1", decided.json()["resumed_run"]["run_id"], "succeeded")
    return key_client(tenant, ["runs", "time_travel"])


def test_fork_as_the_gate_node_after_a_denial_is_refused(worker):
    tenant = make_tenant()
    client = _denied_refund(tenant)
    at_gate = checkpoint_where(client, "case-1", ["request_approval"])
    response = fork(client, at_gate, APPROVING, as_node="request_approval")
    assert_approval_required(response)
    assert "request_approval" in response.json()["message"]
    assert not DemoPayment.objects.exists()


def test_fork_as_a_node_past_the_gate_is_refused(worker):
    tenant = make_tenant()
    client = _denied_refund(tenant)
    at_gate = checkpoint_where(client, "case-1", ["request_approval"])
    response = fork(client, at_gate, {}, as_node="execute_refund")
    assert_approval_required(response)
    assert "execute_refund" in response.json()["message"]


def test_fork_rewriting_a_denial_into_an_approval_is_refused(worker):
    """Values only: LangGraph writes as request_approval, the last writer,
    and the thread would continue at execute_refund."""
    tenant = make_tenant()
    client = _denied_refund(tenant)
    after_gate = checkpoint_where(client, "case-1", ["notify_denial"])
    count = len(client.get("/api/v1/threads/case-1/history").json()["results"])
    response = fork(client, after_gate, APPROVING)
    body = assert_approval_required(response)
    assert "execute_refund" in body["message"]
    history = client.get("/api/v1/threads/case-1/history").json()["results"]
    assert len(history) == count  # the refused checkpoint was rolled back


def test_fork_as_the_declared_gate_node_before_the_gate_was_reached_is_refused(
    worker,
):
    """A thread that never reached its gate: the agent's declaration says
    where the gate is."""
    tenant = make_tenant()
    client = key_client(tenant, ["runs", "time_travel"])
    bad_input = {"customer_message": "refund please", "order": {}}
    client.post(
        "/api/v1/threads", {"thread_id": "case-1", "agent": "refund"}, format="json"
    )
    run_id = client.post(
        "/api/v1/threads/case-1/runs", {"input": bad_input}, format="json"
    ).json()["run_id"]
    wait_run(client, "case-1", run_id, "failed")
    first = checkpoint_where(client, "case-1", ["read_request"])
    response = fork(
        client,
        first,
        {
            "plan": {"action": "refund_order", "args": {}, "reason": "x"},
            "decision": {"approved": True, "args": refund_input()["order"]},
        },
        as_node="request_approval",
    )
    assert_approval_required(response)


def test_fork_before_the_gate_goes_through_the_gate_again(worker):
    """Allowed: the fork changes the input; the gate asks for a new decision."""
    tenant = make_tenant()
    client = _denied_refund(tenant)
    first = checkpoint_where(client, "case-1", ["read_request"])
    forked = fork(client, first, {"order": {"id": "A-7", "amount": "9.00"}})
    assert forked.status_code == 201, forked.content
    branch = forked.json()["checkpoint_id"]
    run = client.post(
        "/api/v1/threads/case-1/runs",
        {"input": {}, "checkpoint_id": branch},
        format="json",
    )
    assert run.status_code == 202, run.content
    wait_run(client, "case-1", run.json()["run_id"], "interrupted")
    fresh = ApprovalRequest.objects.get(status="pending")
    assert fresh.action == "refund_order"
    assert not DemoPayment.objects.exists()
    event = AuditEvent.objects.for_tenant(tenant).get(kind="thread.forked")
    assert event.actor_label.startswith("key ") and event.data["as_node"] == ""


def _paid_refund(tenant):
    """A 40.00 refund approved and paid; a client that may time travel."""
    request, _ = waiting_refund(tenant, amount="40.00")
    client = key_client(tenant, ["runs", "approvals", "time_travel"])
    decided = client.post(
        f"/api/v1/approvals/{request.pk}/decision", {"approved": True}, format="json"
    )
    wait_run(client, "case-1", decided.json()["resumed_run"]["run_id"], "succeeded")
    return client


def test_run_from_a_checkpoint_past_a_decided_gate_is_refused(worker):
    """Replaying after an approved refund would pay again on one approval."""
    client = _paid_refund(make_tenant())
    assert DemoPayment.objects.count() == 1
    past = checkpoint_where(client, "case-1", ["execute_refund"])
    response = client.post(
        "/api/v1/threads/case-1/runs",
        {"input": {}, "checkpoint_id": past},
        format="json",
    )
    assert_approval_required(response)
    assert DemoPayment.objects.count() == 1
    assert not Run.objects.filter(kind="replay").exists()


def test_run_from_the_gates_checkpoint_asks_for_a_new_decision(worker):
    client = _paid_refund(make_tenant())
    at_gate = checkpoint_where(client, "case-1", ["request_approval"])
    run = client.post(
        "/api/v1/threads/case-1/runs",
        {"input": {}, "checkpoint_id": at_gate},
        format="json",
    )
    assert run.status_code == 202, run.content
    wait_run(client, "case-1", run.json()["run_id"], "interrupted")
    assert ApprovalRequest.objects.filter(status="pending").count() == 1
    assert DemoPayment.objects.count() == 1


# --- 3. Every caller, every path -------------------------------------------------------

ATTACKS = ["resume", "resume_by_id", "fork_as_gate", "fork_values", "replay"]


def _attack(client, name, *, request, interrupt_id, at_gate):
    if name == "resume":
        body = {"resume": {"approved": True}}
        return client.post("/api/v1/threads/case-1/resume", body, format="json")
    if name == "resume_by_id":
        body = {"resume": {interrupt_id: APPROVED}}
        return client.post("/api/v1/threads/case-1/resume", body, format="json")
    if name == "fork_as_gate":
        return fork(client, at_gate, APPROVING, as_node="request_approval")
    if name == "fork_values":
        return fork(client, at_gate, APPROVING)
    body = {"input": {}, "checkpoint_id": at_gate}
    return client.post("/api/v1/threads/case-1/runs", body, format="json")


GATE = (409, "approval_required")
FORBIDDEN = (403, "permission_denied")
# A runs writer without time_travel: resumes refused by the gate, time travel
# by the missing scope.
RUNS_WRITER = {"resume": GATE, "resume_by_id": GATE} | dict.fromkeys(
    ["fork_as_gate", "fork_values", "replay"], FORBIDDEN
)


@pytest.mark.parametrize(
    "caller, expected",
    [
        ("runs_key", RUNS_WRITER),
        ("time_travel_key", dict.fromkeys(ATTACKS, GATE)),
        ("approvals_service_key", dict.fromkeys(ATTACKS, FORBIDDEN)),
        ("reviewer", dict.fromkeys(ATTACKS, FORBIDDEN)),
        ("tenant_admin", RUNS_WRITER),
    ],
)
def test_no_caller_gets_past_the_gate_by_any_path(worker, caller, expected):
    tenant = make_tenant()
    request, interrupt_id = waiting_refund(tenant)
    at_gate = checkpoint_where(
        key_client(tenant, ["runs"]), "case-1", ["request_approval"]
    )
    client = {
        "runs_key": lambda: key_client(tenant, ["runs"]),
        "time_travel_key": lambda: key_client(tenant, ["runs", "time_travel"]),
        "approvals_service_key": lambda: key_client(tenant, ["approvals"]),
        "reviewer": lambda: session_client(tenant, "reviewer"),
        "tenant_admin": lambda: session_client(tenant, "tenant_admin"),
    }[caller]()
    seen = {}
    for name in ATTACKS:
        response = _attack(
            client, name, request=request, interrupt_id=interrupt_id, at_gate=at_gate
        )
        seen[name] = (response.status_code, response.json()["code"])
    assert seen == expected
    assert_gate_held(request, tenant)


def test_the_admin_has_no_way_to_change_a_threads_state(worker):
    from tests.approvals.helpers import logged_in

    tenant = make_tenant()
    request, _ = waiting_refund(tenant)
    for role in ("compliance_officer", "tenant_admin"):
        client = logged_in(make_member(tenant, role=role).user)
        url = f"/admin/runs/thread/{request.thread_id}/change/"
        assert client.post(url, {"status": "idle"}).status_code == 405
    assert_gate_held(request, tenant)


def test_fork_needs_the_time_travel_scope(worker):
    tenant = make_tenant()
    client = key_client(tenant, ["runs", "approvals", "audit"])
    client.post("/api/v1/threads", {"thread_id": "t1", "agent": "echo"}, format="json")
    response = client.post(
        "/api/v1/threads/t1/fork", {"checkpoint_id": "x", "values": {}}, format="json"
    )
    assert response.status_code == 403
    assert "time_travel" in response.json()["message"]
