"""threads_migrate: paused threads moved to a new version by a function."""

import pytest
from django.core.management import CommandError, call_command

from approvals.models import ApprovalRequest
from audit.models import AuditEvent
from runs.graphs import compile_for, thread_config
from runs.models import Thread
from tests.durable.helpers import decide, start, state, wait_run
from tests.factories import tenant_with_client

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]
MIGRATE = ["--agent", "order", "--from", "1", "--to", "2"]
FUNCTION = ["--with", "tests.durable_agents:order_to_v2"]
ORDERS = {
    "o-1": {"id": "A-1", "amount": "12.50"},
    "o-2": {"id": "A-2", "amount": "3.10"},
    # Waits at node "escalate", which order@2 does not have.
    "o-3": {"id": "A-3", "amount": "99.00", "escalate": True},
}


@pytest.fixture
def paused(worker, settings):
    """Three threads of order@1 waiting on an approval; the tenant's slug."""
    settings.GATEHOUSE_DRAINING_AGENTS = ["order@2"]  # they start on order@1
    tenant, client = tenant_with_client()
    for thread_id, order in ORDERS.items():
        run_id = start(
            client, "order", thread_id, {"order": order, "legacy_flag": True}
        )
        assert wait_run(run_id).status == "interrupted"
    settings.GATEHOUSE_DRAINING_AGENTS = []
    return tenant, client


def latest_checkpoint(thread_id: str) -> str:
    thread = Thread.objects.get(thread_id=thread_id)
    snapshot = compile_for(thread).get_state(thread_config(thread))
    return snapshot.config["configurable"]["checkpoint_id"]


def migrate(*options: str) -> None:
    with pytest.raises(CommandError, match="1 thread"):
        call_command("threads_migrate", *MIGRATE, *FUNCTION, *options)


def test_dry_run_reports_each_threads_key_changes_and_writes_nothing(paused, capsys):
    tenant, _ = paused
    before = {thread_id: latest_checkpoint(thread_id) for thread_id in ORDERS}
    migrate("--dry-run")

    out = capsys.readouterr().out
    slug = tenant.slug
    for thread_id in ("o-1", "o-2"):
        assert (
            f"{slug}/{thread_id}: would migrate: +1 (amount_cents) -1 (legacy_flag)"
            in out
        )
    assert (
        f"{slug}/o-3: cannot migrate: it waits at node 'escalate', which agent "
        "order@2 does not have; left untouched" in out
    )
    assert "2 thread(s) would migrate, 1 cannot be migrated" in out
    assert "1250" not in out and "12.50" not in out  # key names, never values
    assert {
        t.thread_id: t.agent_version for t in Thread.objects.all()
    } == dict.fromkeys(ORDERS, "1")
    assert {thread_id: latest_checkpoint(thread_id) for thread_id in ORDERS} == before
    assert not AuditEvent.objects.filter(kind="thread.migrated").exists()


def test_migration_moves_paused_threads_and_leaves_the_one_it_cannot(paused, capsys):
    tenant, client = paused
    untouched = latest_checkpoint("o-3")
    migrate()
    assert "2 thread(s) migrated, 1 cannot be migrated" in capsys.readouterr().out

    versions = dict(Thread.objects.values_list("thread_id", "agent_version"))
    assert versions == {"o-1": "2", "o-2": "2", "o-3": "1"}
    assert latest_checkpoint("o-3") == untouched
    events = AuditEvent.objects.for_tenant(tenant).filter(kind="thread.migrated")
    assert sorted(events.values_list("thread_id", flat=True)) == ["o-1", "o-2"]
    data = events.get(thread_id="o-1").data
    assert (data["from_version"], data["to_version"], data["added"]) == ("1", "2", 1)
    assert "12.50" not in str(data) and "amount_cents" not in str(data)

    # The requests follow their interrupts; the decision resumes on order@2.
    thread = Thread.objects.get(thread_id="o-1")
    waiting = compile_for(thread).get_state(thread_config(thread)).interrupts
    request = ApprovalRequest.objects.get(thread=thread)
    assert [item.id for item in waiting] == [request.interrupt_id]
    assert wait_run(decide(client, "o-1")).status == "succeeded"
    values = state(client, "o-1")
    assert values["outcome"] == "shipped 1250 cents"
    assert "legacy_flag" not in values
    assert wait_run(decide(client, "o-3")).status == "succeeded"


def test_a_thread_whose_migration_function_raises_is_left_untouched(
    worker, settings, capsys
):
    settings.GATEHOUSE_DRAINING_AGENTS = ["order@2"]
    tenant, client = tenant_with_client()
    order = {"order": {"id": "A-9", "amount": "1", "corrupt": True}}
    assert wait_run(start(client, "order", "o-9", order)).status == "interrupted"
    before = latest_checkpoint("o-9")
    with pytest.raises(CommandError, match="1 thread"):
        call_command("threads_migrate", *MIGRATE, *FUNCTION, "--tenant", tenant.slug)
    assert (
        "o-9: cannot migrate: the migration function raised ValueError; left untouched"
        in capsys.readouterr().out
    )
    assert Thread.objects.get(thread_id="o-9").agent_version == "1"
    assert latest_checkpoint("o-9") == before


def test_an_idle_thread_is_migrated_too(worker, settings, capsys):
    settings.GATEHOUSE_DRAINING_AGENTS = ["order@2"]
    tenant, client = tenant_with_client()
    order = {"order": {"id": "A-5", "amount": "2"}, "legacy_flag": True}
    assert wait_run(start(client, "order", "o-5", order)).status == "interrupted"
    assert wait_run(decide(client, "o-5")).status == "succeeded"

    call_command("threads_migrate", *MIGRATE, *FUNCTION, "--tenant", tenant.slug)
    assert "1 thread(s) migrated, 0 cannot be migrated" in capsys.readouterr().out
    thread = Thread.objects.get(thread_id="o-5")
    assert (thread.status, thread.agent_version) == ("idle", "2")
    values = state(client, "o-5")
    assert values["amount_cents"] == 200 and "legacy_flag" not in values
