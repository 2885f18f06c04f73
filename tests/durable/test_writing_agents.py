"""docs/writing-agents.md: every example module on the page runs as it says.

The page's example modules are registered as `doc-<name>@1` (see
tests/docs_examples.py) and run here on the real worker, over REST.
"""

import pytest
from django.core.management import call_command

from approvals.content import payload_of
from approvals.models import ApprovalRequest
from audit.models import AuditEvent
from demo.models import DemoCharge, DemoCourierCall, DemoStockReservation
from runs.models import Thread, ToolCall
from tests.docs_examples import AGENTS, examples
from tests.durable.helpers import decide, start, state, wait_run
from tests.factories import (
    api_client,
    make_api_key,
    make_member,
    tenant_with_client,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


def test_every_example_on_the_page_is_run_here():
    assert set(examples()) == set(AGENTS)


def test_functional_example_ships_after_the_approval(worker):
    _, client = tenant_with_client()
    run_id = start(client, "doc-functional", "ship-1", {"order": {"id": "A-7"}})
    assert wait_run(run_id).status == "interrupted"
    assert ApprovalRequest.objects.get().action == "ship_order"
    assert wait_run(decide(client, "ship-1")).status == "succeeded"
    values = state(client, "ship-1")
    assert values["shipped"] is True and values["quote"]["order_id"] == "A-7"


def test_replay_example_keeps_its_ticket_across_the_approval(worker, settings):
    settings.GATEHOUSE_DRAINING_AGENTS = ["doc-replay@2"]  # version 1's example
    _, client = tenant_with_client()
    assert wait_run(start(client, "doc-replay", "case-1", {})).status == "interrupted"
    approved = payload_of(ApprovalRequest.objects.get())["args"]
    assert wait_run(decide(client, "case-1")).status == "succeeded"
    values = state(client, "case-1")
    assert (values["ticket"], values["deadline"]) == (
        approved["ticket"],
        approved["deadline"],
    )


def test_gated_example_raises_the_risk_of_an_edit_and_executes_it(worker):
    tenant, client = tenant_with_client()
    invoice = {"supplier": "Acme Tools", "amount": "80.00"}
    run_id = start(client, "doc-gated", "inv-1", {"invoice": invoice})
    assert wait_run(run_id).status == "interrupted"
    request = ApprovalRequest.objects.get()
    assert (request.risk, request.required_approvals) == ("low", 1)
    url = f"/api/v1/approvals/{request.pk}/decision"
    alice, bob = (
        api_client(make_api_key(tenant, ["approvals"], user=user)[1])
        for user in (make_member(tenant).user, make_member(tenant).user)
    )
    note = {"approved": True, "note": "The invoice was short."}
    refused = alice.post(
        url, {**note, "args": {**invoice, "supplier": "Other"}}, format="json"
    )
    assert list(refused.json()["fields"]["args"]) == ["supplier"]
    edited = {**invoice, "amount": "1200.00"}
    first = alice.post(url, {**note, "args": edited}, format="json").json()
    assert (first["status"], first["risk"], first["required_approvals"]) == (
        "pending",
        "high",
        2,
    )
    second = bob.post(url, {"approved": True}, format="json").json()
    assert wait_run(second["resumed_run"]["run_id"]).status == "succeeded"
    decision = state(client, "inv-1")["decision"]
    assert decision["args"] == edited
    assert decision["edits"] == [{"arg": "amount", "old": "80.00", "new": "1200.00"}]


def test_patching_example_gives_a_new_thread_the_new_path(worker):
    _, client = tenant_with_client()
    order = {"order": {"id": "A-9"}}
    assert wait_run(start(client, "doc-patching", "o-1", order)).status == (
        "interrupted"
    )
    assert Thread.objects.get(thread_id="o-1").patches == ["add-fraud-check"]
    assert wait_run(decide(client, "o-1")).status == "succeeded"
    assert state(client, "o-1")["checks"] == ["address", "fraud"]


def test_migration_example_moves_a_waiting_case_to_version_2(worker, settings, capsys):
    settings.GATEHOUSE_DRAINING_AGENTS = ["doc-replay@2"]
    tenant, client = tenant_with_client()
    assert wait_run(start(client, "doc-replay", "c-2", {})).status == "interrupted"
    command = ["threads_migrate", "--agent", "doc-replay", "--from", "1", "--to", "2"]
    command += ["--with", "writing_agents.migration:to_v2"]
    call_command(*command, "--dry-run")
    assert f"{tenant.slug}/c-2: would migrate: +1 (priority)" in capsys.readouterr().out
    call_command(*command)
    assert Thread.objects.get(thread_id="c-2").agent_version == "2"

    approved = payload_of(ApprovalRequest.objects.get())["args"]
    assert wait_run(decide(client, "c-2")).status == "succeeded"
    values = state(client, "c-2")
    assert values["priority"] == "normal"
    assert (values["ticket"], values["due"]) == (
        approved["ticket"],
        approved["deadline"],
    )


def test_retries_example_books_on_the_third_attempt_with_one_key(worker):
    _, client = tenant_with_client()
    pickup = {"order": {"id": "P-1", "courier_outages": 2}}
    assert wait_run(start(client, "doc-retries", "p-1", pickup)).status == "succeeded"
    call = ToolCall.objects.get()
    assert [entry["outcome"] for entry in call.attempt_log] == [
        "failed",
        "failed",
        "succeeded",
    ]
    assert set(DemoCourierCall.objects.values_list("idempotency_key", flat=True)) == {
        call.idempotency_key
    }
    assert state(client, "p-1")["booking"]["order_id"] == "P-1"


def test_saga_example_refunds_then_releases_when_shipping_fails(worker):
    _, client = tenant_with_client()
    order = {
        "id": "S-1",
        "items": [{"sku": "MUG-1", "qty": 1}],
        "amount": "12.00",
        "courier_refuses": True,
    }
    run = wait_run(start(client, "doc-saga", "s-1", {"order": order}))
    assert (run.status, run.compensation) == ("failed", "compensated")
    charge, reservation = DemoCharge.objects.get(), DemoStockReservation.objects.get()
    assert charge.refunded_at < reservation.released_at
    undone = AuditEvent.objects.filter(thread_id="s-1", kind="tool.compensated")
    assert [e.action for e in undone.order_by("seq")] == ["refund", "release"]
