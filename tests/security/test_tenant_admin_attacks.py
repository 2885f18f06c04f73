"""A tenant admin reads no decrypted content on any path (issue 16, finding
2, beyond /api/v1/threads/{id}/state): not through the Agent Protocol with
their session or their personal key, and not by subscribing a webhook to
thread content, over the API or in the admin."""

import pytest
from django.test import Client

from audit.models import AuditEvent
from audit.services import Actor
from runs import services
from runs.models import ApiKey
from tests.approvals.helpers import logged_in
from tests.factories import (
    api_client,
    make_api_key,
    make_member,
    make_superuser,
    make_tenant,
    tenant_with_client,
)
from tests.runs.test_approvals_flow import interrupted_thread
from webhooks.models import WebhookSubscription

pytestmark = pytest.mark.django_db

HOOK = "https://hooks.example.com/in"


@pytest.fixture
def tenant():
    tenant = make_tenant()
    services.thread_create(
        tenant=tenant, agent="echo", thread_id="t1", actor=Actor.system("t")
    )
    return tenant


@pytest.fixture(autouse=True)
def public_hooks(settings):
    settings.GATEHOUSE_WEBHOOK_ALLOW_PRIVATE = True


def agent_protocol_reads():
    yield "GET", "/langgraph/threads/t1", None
    yield "GET", "/langgraph/threads/t1/state", None
    yield "POST", "/langgraph/threads/t1/history", {}
    yield "POST", "/langgraph/threads/search", {}
    yield "POST", "/langgraph/threads/t1/copy", {}
    yield "PATCH", "/langgraph/threads/t1", {"metadata": {}}
    yield "POST", "/langgraph/threads", {"thread_id": "t1", "if_exists": "do_nothing"}
    yield "POST", "/langgraph/threads/t1/runs/wait", {"assistant_id": "echo"}
    yield "POST", "/langgraph/threads/t1/runs/stream", {"assistant_id": "echo"}


def call(client, method, path, body, **headers):
    if body is None:
        return client.generic(method, path, **headers)
    return client.generic(
        method,
        path,
        data=__import__("json").dumps(body),
        content_type="application/json",
        **headers,
    )


def test_a_tenant_admin_reads_nothing_through_the_agent_protocol(tenant):
    member = make_member(tenant, role="tenant_admin")
    session = logged_in(member.user)
    _, personal = make_api_key(tenant, ["runs"], user=member.user)
    for method, path, body in agent_protocol_reads():
        for how, response in (
            ("session", call(session, method, path, body)),
            (
                "personal key",
                call(Client(), method, path, body, HTTP_X_API_KEY=personal),
            ),
        ):
            assert response.status_code == 403, (how, method, path)
            assert response.json()["code"] == "permission_denied"
    # A reviewer's session, who may read state, is served.
    reviewer = logged_in(make_member(tenant, role="reviewer").user)
    assert reviewer.get("/langgraph/threads/t1").status_code == 200


def test_a_tenant_admin_cannot_subscribe_a_webhook_to_thread_content(tenant):
    member = make_member(tenant, role="tenant_admin")
    session = logged_in(member.user)
    refused = session.post(
        "/api/v1/webhooks",
        {"url": HOOK, "events": ["run.succeeded"], "include_content": True},
        content_type="application/json",
    )
    assert refused.status_code == 403, refused.content
    form = session.post(
        "/admin/webhooks/webhooksubscription/add/",
        {
            "tenant": tenant.pk,
            "url": HOOK,
            "events": ["run.succeeded"],
            "include_content": "on",
        },
    )
    assert form.status_code == 200 and "errorlist" in form.content.decode()
    assert not WebhookSubscription.objects.exists()
    # Without content, managing subscriptions is theirs.
    allowed = session.post(
        "/api/v1/webhooks",
        {"url": HOOK, "events": ["run.succeeded"], "include_content": False},
        content_type="application/json",
    )
    assert allowed.status_code == 201, allowed.content
    # A service key of the integration, which reads content anyway, may.
    _, secret = make_api_key(tenant, ["runs"])
    with_content = api_client(secret).post(
        "/api/v1/webhooks",
        {"url": HOOK, "events": ["run.succeeded"], "include_content": True},
        format="json",
    )
    assert with_content.status_code == 201, with_content.content


@pytest.mark.django_db(transaction=True)
@pytest.mark.worker
def test_a_tenant_admin_sees_a_threads_records_with_its_content_withheld(worker):
    """The thread's detail shows interrupt values (an approval's arguments)
    and its runs their errors: a tenant admin sees the records, not the
    content, and nothing is read."""
    tenant, client = tenant_with_client()
    interrupted_thread(client, "gate", thread_id="t1")
    failed = interrupted_thread(client, "incomplete", thread_id="f1")
    admin = logged_in(make_member(tenant, role="tenant_admin").user)

    detail = admin.get("/api/v1/threads/t1").json()
    assert detail["status"] == "interrupted" and detail["pending_approvals"]
    assert "interrupts" not in detail
    for path in ("/api/v1/threads/f1/runs", f"/api/v1/threads/f1/runs/{failed.pk}"):
        body = admin.get(path).json()
        error = body["results"][0]["error"] if "results" in body else body["error"]
        assert "withheld" in error, path
    assert not AuditEvent.objects.filter(kind__endswith="read").exists()
    # The key's own view is unchanged.
    assert "action" in client.get("/api/v1/threads/t1").json()["interrupts"][0]["value"]


def test_a_key_a_tenant_admin_issues_reads_no_more_than_they_can(tenant):
    """A `runs` service key reads decrypted state: issued by a tenant admin,
    who may not, it would be their way around the rule. It keeps its scope
    (threads and runs) but never gets what its issuer lacks."""
    admin = logged_in(make_member(tenant, role="tenant_admin").user)
    page = admin.post(
        "/admin/runs/apikey/add/",
        {"tenant": tenant.pk, "name": "integration", "scopes": ["runs"]},
        follow=True,
    )
    secret = page.context["secret"]
    key = ApiKey.objects.get(name="integration")
    assert key.withheld == ["threads.read_state"]
    issued = AuditEvent.objects.get(kind="api_key.created")
    assert issued.data["withheld"] == "threads.read_state"

    client = api_client(secret)
    refused = client.get("/api/v1/threads/t1/state")
    assert refused.status_code == 403 and refused.json()["code"] == "permission_denied"
    assert (
        call(
            Client(), "GET", "/langgraph/threads/t1", None, HTTP_X_API_KEY=secret
        ).status_code
        == 403
    )
    hook = client.post(
        "/api/v1/webhooks",
        {"url": HOOK, "events": ["run.succeeded"], "include_content": True},
        format="json",
    )
    assert hook.status_code == 403
    # What its scope is for still works.
    made = client.post("/api/v1/threads", {"agent": "echo"}, format="json")
    assert made.status_code == 201, made.content

    # The operator (a superuser) issues keys that read what their scopes say.
    root = logged_in(make_superuser(username="root"))
    root.post(
        "/admin/runs/apikey/add/",
        {"tenant": tenant.pk, "name": "operator's", "scopes": ["runs"]},
    )
    assert ApiKey.objects.get(name="operator's").withheld == []
