"""LangGraph's checkpointer conformance suite against DjangoSaver.

The suite is async; it runs here under `asyncio.run`, so DjangoSaver's async
methods run Django's ORM in asgiref's worker thread, on its own connection:
the tests commit (transaction=True) for that connection to see the tenant.
"""

import asyncio

import pytest
from asgiref.sync import sync_to_async
from django.db import connections
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import (
    BASE_CAPABILITIES,
    EXTENDED_CAPABILITIES,
)

from runs.checkpointer import DjangoSaver
from runs.models import Tenant
from tests.factories import make_tenant

BASE_TESTS = 58
EXTENDED_TESTS = 23


def _conformance_report(tenant: Tenant, using: str):
    @checkpointer_test(name=f"DjangoSaver on {using}")
    async def django_saver():
        yield DjangoSaver(tenant=tenant, using=using)

    async def run():
        try:
            return await validate(django_saver)
        finally:
            # The worker thread's connections would outlive the test database.
            await sync_to_async(connections.close_all)()

    return asyncio.run(run())


def _assert_full_conformance(report) -> None:
    def count(capabilities, field):
        return sum(getattr(report.results[c.value], field) for c in capabilities)

    failures = [f for r in report.results.values() for f in r.failures]
    assert failures == [], "\n".join(failures)
    assert count(BASE_CAPABILITIES, "tests_passed") == BASE_TESTS
    assert count(EXTENDED_CAPABILITIES, "tests_passed") == EXTENDED_TESTS
    assert count(BASE_CAPABILITIES | EXTENDED_CAPABILITIES, "tests_failed") == 0
    assert report.conformance_level() == "FULL"


@pytest.mark.django_db(transaction=True)
def test_conformance_suite_passes_on_postgres():
    report = _conformance_report(make_tenant(), "default")
    _assert_full_conformance(report)


@pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])
def test_conformance_suite_passes_on_sqlite():
    tenant = Tenant.objects.using("sqlite").create(slug="conformance", name="C")
    report = _conformance_report(tenant, "sqlite")
    _assert_full_conformance(report)
