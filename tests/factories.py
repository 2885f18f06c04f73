"""Factories for test setup: each call makes fresh, independent rows."""

from __future__ import annotations

import itertools

from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from audit.services import Actor
from runs import services
from runs.crypto import ThreadCipher
from runs.models import Membership, Tenant, Thread

_counter = itertools.count(1)
ALL_SCOPES = ["runs", "approvals", "audit", "time_travel"]


# The refund agent's input in the tests that run its flow.
REFUND_INPUT = {
    "customer_message": "My blender arrived damaged, please refund me.",
    "order": {"id": "A-1001", "amount": "40.00", "currency": "EUR"},
}


def make_tenant(slug: str | None = None) -> Tenant:
    slug = slug or f"tenant-{next(_counter)}"
    return services.tenant_create(
        slug=slug, name=slug.title(), actor=Actor.system("tests")
    )


_key_numbers = itertools.count(1)


def make_api_key(
    tenant: Tenant, scopes: list[str] | None = None, name: str = "", user=None
):
    """Returns (ApiKey, secret); with `user`, a personal key of theirs. Without
    a name, one of its own (names are unique in a tenant)."""
    issued = services.api_key_create(
        tenant=tenant,
        name=name or f"test key {next(_key_numbers)}",
        scopes=scopes or ALL_SCOPES,
        actor=Actor.system("tests"),
        user=user,
    )
    return issued.api_key, issued.secret


def make_member(
    tenant: Tenant,
    role: str = "reviewer",
    username: str | None = None,
    password: str = "correct horse battery staple",
) -> Membership:
    username = username or f"user{next(_counter)}"
    return services.reviewer_create(
        tenant=tenant,
        username=username,
        password=password,
        role=role,
        actor=Actor.system("tests"),
    )


def make_superuser(
    username: str | None = None, password: str = "correct horse battery staple"
):
    username = username or f"admin{next(_counter)}"
    return get_user_model().objects.create_superuser(
        username, f"{username}@example.com", password
    )


def api_client(secret: str | None = None) -> APIClient:
    client = APIClient()
    if secret:
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def tenant_with_client(scopes: list[str] | None = None):
    """A new tenant and an API client authenticated with a key of it."""
    tenant = make_tenant()
    _, secret = make_api_key(tenant, scopes)
    return tenant, api_client(secret)


def stored_cipher(thread_pk: int):
    """The cipher of a thread's key as stored now (ThreadDeleted if shredded),
    not as some instance in the test last saw it."""
    return ThreadCipher.for_thread(Thread.objects.get(pk=thread_pk))
