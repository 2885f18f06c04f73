"""Patches: threads paused before a deploy keep their path after it."""

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command

from approvals.models import ApprovalRequest
from audit.services import Actor
from gatehouse import durable
from runs.models import Thread
from runs.services import thread_create
from tests.approvals.helpers import waiting_request
from tests.durable.helpers import InProcess, decide, start, state, wait_run
from tests.factories import make_tenant, tenant_with_client
from tests.workers import deployed

pytestmark = pytest.mark.django_db(transaction=True)
PATCHED = "review@1=tests.durable_agents:review_graph_patched"


def payload_checks(thread_id: str) -> list:
    from approvals.content import payload_of

    return payload_of(ApprovalRequest.objects.get(thread__thread_id=thread_id))["args"][
        "checks"
    ]


@pytest.mark.worker
def test_threads_paused_across_a_deploy_finish_on_their_own_path(worker):
    _, client = tenant_with_client()
    assert wait_run(start(client, "review", "old", {})).status == "interrupted"

    with deployed(worker, f"{settings.GATEHOUSE_AGENTS},{PATCHED}"):
        assert wait_run(start(client, "review", "new", {})).status == "interrupted"
        assert Thread.objects.get(thread_id="old").patches == []
        assert Thread.objects.get(thread_id="new").patches == ["add-fraud-check"]
        assert payload_checks("old") == ["amount"]
        assert payload_checks("new") == ["amount", "fraud"]

        assert wait_run(decide(client, "old")).status == "succeeded"
        assert wait_run(decide(client, "new")).status == "succeeded"
        assert state(client, "old")["checks"] == ["amount"]
        assert state(client, "new")["checks"] == ["amount", "fraud"]


def test_resume_of_a_thread_whose_patch_the_code_lacks_is_version_skew(settings):
    """A rollback: the thread took a patch the registered code does not know."""
    tenant = make_tenant()
    approval = waiting_request(tenant)
    Thread.objects.filter(pk=approval.thread_id).update(patches=["add-fraud-check"])
    from tests.factories import api_client, make_api_key

    _, secret = make_api_key(tenant)
    response = api_client(secret).post(
        f"/api/v1/approvals/{approval.pk}/decision", {"approved": True}, format="json"
    )
    assert response.status_code == 409
    assert response.json()["code"] == "version_skew"
    assert "'add-fraud-check'" in response.json()["message"]
    approval.refresh_from_db()
    assert approval.status == "pending" and not approval.decisions.exists()


def test_patched_names_a_patch_the_version_must_declare():
    def node(state: dict) -> dict:
        durable.patched("undeclared")
        return {}

    with pytest.raises(durable.UndeclaredPatch, match="does not declare"):
        InProcess(node).invoke({"x": 1})


def pinned(tenant, thread_id: str, agent: str, version: str, patches=()) -> Thread:
    thread = thread_create(
        tenant=tenant, agent=agent, actor=Actor.system("tests"), thread_id=thread_id
    )
    Thread.objects.filter(pk=thread.pk).update(
        agent_version=version, patches=sorted(patches), status="interrupted"
    )
    return thread


def test_agents_check_lists_versions_and_passes_when_every_thread_fits(capsys):
    tenant = make_tenant("acme")
    pinned(tenant, "t-1", "review", "1")
    call_command("agents_check", "--tenant", "acme")
    out = capsys.readouterr().out
    assert "review@1: 1 interrupted; patches: none" in out
    assert "Every thread can continue." in out


def test_agents_check_reports_threads_no_registered_version_can_continue(
    settings, capsys
):
    settings.GATEHOUSE_AGENTS = (
        "review@2=tests.durable_agents:review_graph_patched,"
        "echo@1=tests.agents:echo_graph"
    )
    tenant = make_tenant("acme")
    pinned(tenant, "gone-1", "review", "1")
    pinned(tenant, "gone-2", "review", "1")
    pinned(tenant, "rolled-back", "review", "2", patches=["add-fraud-check", "later"])
    pinned(tenant, "fine", "review", "2", patches=["add-fraud-check"])

    with pytest.raises(CommandError, match="3 thread"):
        call_command("agents_check")
    out = capsys.readouterr().out
    assert "review@2: 1 interrupted; patches: add-fraud-check" in out
    assert (
        "review@1: 2 thread(s) (2 interrupted): agent review@1 is not registered; "
        "acme/gone-1, acme/gone-2" in out
    )
    assert "it took patch 'later', which agent review@2 does not declare" in out
    assert "acme/rolled-back" in out and "acme/fine" not in out


def test_a_retired_patch_refuses_threads_that_started_without_it(settings, capsys):
    from tests import durable_agents

    durable_agents.review_graph_patched.retired_patches = frozenset({"old-check"})
    try:
        settings.GATEHOUSE_AGENTS = "review@2=tests.durable_agents:review_graph_patched"
        pinned(make_tenant("acme"), "early", "review", "2")
        with pytest.raises(CommandError, match="1 thread"):
            call_command("agents_check")
    finally:
        del durable_agents.review_graph_patched.retired_patches
    assert "started before patch 'old-check'" in capsys.readouterr().out
