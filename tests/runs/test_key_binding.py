"""A wrapped data key is bound to its tenant and its thread (issue 16,
finding 12): copied to another thread's row, even of the same tenant, it
does not unwrap, and every read of that thread says so instead of answering
500. Keys wrapped before the binding are rewrapped by a migration, and
rotation keeps working."""

import importlib

import pytest
from django.apps import apps
from django.core.management import call_command
from django.db import connection
from django.test import override_settings

from approvals.models import ApprovalRequest
from audit.services import Actor
from runs import crypto
from runs.models import Thread
from tests.factories import make_member, make_tenant, tenant_with_client
from tests.runs.test_approvals_flow import interrupted_thread
from tests.runs.test_checkpointer import NEW, OLD
from webhooks import services as webhooks
from webhooks.models import WebhookSubscription

ROW = ("run-input", "r1")


def new_thread(tenant, thread_id="a") -> Thread:
    return Thread.objects.create_with_data_key(tenant=tenant, thread_id=thread_id)


def copy_key(source: Thread, target: Thread) -> Thread:
    Thread.objects.filter(pk=target.pk).update(
        wrapped_data_key=source.wrapped_data_key, data_key_id=source.data_key_id
    )
    return Thread.objects.get(pk=target.pk)


def legacy_wrap(data_key: bytes, *, key_id: str, tenant_id: int) -> bytes:
    """A key as versions before the binding wrapped it: bound to the master key
    and the tenant only."""
    master = crypto.AESGCM(crypto.keyring().key(key_id))
    return crypto._seal(
        master, data_key, crypto._legacy_wrap_aad(key_id, tenant_id)
    )


def run_migration(name: str) -> None:
    migration = importlib.import_module(name).Migration
    with connection.schema_editor() as editor:
        migration.operations[0].code(apps, editor)


@pytest.mark.django_db
def test_a_wrapped_key_copied_to_another_thread_of_the_tenant_does_not_unwrap():
    tenant = make_tenant()
    a, b = new_thread(tenant, "a"), new_thread(tenant, "b")
    secret = crypto.ThreadCipher.for_thread(a).encrypt_value("card 4242", row=ROW)
    b = copy_key(a, b)
    crypto.forget_data_key(b.pk)
    with pytest.raises(crypto.TamperedCiphertext, match="data key of thread"):
        crypto.ThreadCipher.for_thread(b)
    # Where it belongs, it still unwraps.
    assert crypto.ThreadCipher.for_thread(a).decrypt_value(secret, row=ROW) == (
        "card 4242"
    )


@pytest.mark.django_db
def test_a_webhook_secret_copied_to_another_subscription_does_not_unwrap():
    tenant = make_tenant()
    first, second = (
        webhooks.subscription_create(
            tenant=tenant,
            url=f"https://hooks{n}.example.com",
            events_wanted=[],
            actor=Actor.system("tests"),
        ).subscription
        for n in (1, 2)
    )
    WebhookSubscription.objects.filter(pk=second.pk).update(
        wrapped_secret=first.wrapped_secret, secret_key_id=first.secret_key_id
    )
    with pytest.raises(crypto.TamperedCiphertext):
        webhooks.secret_text(WebhookSubscription.objects.get(pk=second.pk))


@pytest.mark.django_db
def test_keys_wrapped_before_the_binding_are_rewrapped_by_the_migrations():
    tenant = make_tenant()
    thread = new_thread(tenant)
    owner = crypto.thread_key_owner(thread.pk)
    secret = crypto.ThreadCipher.for_thread(thread).encrypt_value("x", row=ROW)
    data_key = crypto.unwrap_data_key(
        wrapped=thread.wrapped_data_key,
        key_id=thread.data_key_id,
        tenant_id=tenant.pk,
        owner=owner,
    )
    old = legacy_wrap(data_key, key_id=thread.data_key_id, tenant_id=tenant.pk)
    Thread.objects.filter(pk=thread.pk).update(wrapped_data_key=old)
    issued = webhooks.subscription_create(
        tenant=tenant,
        url="https://hooks.example.com",
        events_wanted=[],
        actor=Actor.system("tests"),
    )
    subscription = issued.subscription
    WebhookSubscription.objects.filter(pk=subscription.pk).update(
        wrapped_secret=legacy_wrap(
            crypto.unwrap_data_key(
                wrapped=subscription.wrapped_secret,
                key_id=subscription.secret_key_id,
                tenant_id=tenant.pk,
                owner=subscription.secret_key_owner,
            ),
            key_id=subscription.secret_key_id,
            tenant_id=tenant.pk,
        )
    )
    # The older format is never read as if it were bound: it could be a copy.
    with pytest.raises(crypto.TamperedCiphertext, match="manage.py migrate"):
        crypto.unwrap_data_key(
            wrapped=old, key_id=thread.data_key_id, tenant_id=tenant.pk, owner=owner
        )

    run_migration("runs.migrations.0015_data_keys_bound_to_threads")
    run_migration("webhooks.migrations.0003_secrets_bound_to_subscriptions")

    thread = Thread.objects.get(pk=thread.pk)
    assert bytes(thread.wrapped_data_key)[0] == crypto.WRAP_FORMAT
    crypto.forget_data_key(thread.pk)
    cipher = crypto.ThreadCipher.for_thread(thread)
    assert cipher.decrypt_value(secret, row=ROW) == "x"
    subscription = WebhookSubscription.objects.get(pk=subscription.pk)
    assert webhooks.secret_text(subscription) == issued.secret


@pytest.mark.django_db
def test_rotation_rewraps_bound_keys_and_they_stay_bound():
    with override_settings(GATEHOUSE_MASTER_KEYS=OLD):
        tenant = make_tenant()
        a, b = new_thread(tenant, "a"), new_thread(tenant, "b")
        secret = crypto.ThreadCipher.for_thread(a).encrypt_value("x", row=ROW)
    with override_settings(GATEHOUSE_MASTER_KEYS=f"{NEW},{OLD}"):
        call_command("rotate_master_key", verbosity=0)
    with override_settings(GATEHOUSE_MASTER_KEYS=NEW):
        a = Thread.objects.get(pk=a.pk)
        assert a.data_key_id == "new"
        assert crypto.ThreadCipher.for_thread(a).decrypt_value(secret, row=ROW) == "x"
        b = copy_key(a, b)
        with pytest.raises(crypto.TamperedCiphertext):
            crypto.ThreadCipher.for_thread(b)


@pytest.mark.django_db(transaction=True)
@pytest.mark.worker
def test_a_thread_holding_a_copied_key_reads_as_unreadable_never_500(worker, client):
    """Over the API, the Agent Protocol and the admin: the thread's page works
    and shows its interrupts as unreadable; a read of content itself is a 409
    `content_unreadable`; nothing answers 500."""
    tenant, api = tenant_with_client()
    interrupted_thread(api, "gate", thread_id="a")
    interrupted_thread(api, "gate", thread_id="b")
    a = Thread.objects.get(thread_id="a")
    b = copy_key(a, Thread.objects.get(thread_id="b"))
    crypto.forget_data_key(b.pk)
    approval = ApprovalRequest.objects.get(thread=b)

    detail = api.get("/api/v1/threads/b")
    assert detail.status_code == 200
    assert detail.json()["status"] == "interrupted"
    assert detail.json()["interrupts"] == [
        {"id": "", "value": {"unreadable": "TamperedCiphertext"}}
    ]
    for path in (
        "/api/v1/threads/b/state",
        f"/api/v1/approvals/{approval.pk}",
        "/langgraph/threads/b",
        "/langgraph/threads/b/state",
    ):
        response = api.get(path)
        assert response.status_code == 409, path
        assert response.json()["code"] == "content_unreadable", path
    # Thread a, whose key it is, reads as before.
    assert api.get("/api/v1/threads/a/state").status_code == 200

    officer = make_member(tenant, role="compliance_officer").user
    client.force_login(officer)
    for path in (
        f"/admin/runs/thread/{b.pk}/change/?checkpoint=latest",
        f"/admin/approvals/approvalrequest/{approval.pk}/change/",
        "/admin/approvals/approvalrequest/",
    ):
        page = client.get(path)
        assert page.status_code == 200, path
        assert b"unreadable" in page.content.lower(), path
