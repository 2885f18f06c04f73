"""runs 0013: keys named alike (or not at all) before names were unique get
names of their own, and the constraint holds from then on."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

BEFORE = [("runs", "0012_thread_step_aliases")]
AFTER = [("runs", "0013_api_key_names_unique")]

pytestmark = pytest.mark.django_db(transaction=True)


def _migrate(targets):
    executor = MigrationExecutor(connection)
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


def test_duplicate_and_empty_names_are_made_unique():
    old = _migrate(BEFORE)
    Tenant, ApiKey = old.get_model("runs", "Tenant"), old.get_model("runs", "ApiKey")
    acme, other = (Tenant.objects.create(slug=slug, name=slug) for slug in "ab")
    for prefix, tenant, name in [
        ("gh_first", acme, "billing"),
        ("gh_second", acme, "billing "),
        ("gh_third", acme, ""),
        ("gh_fourth", other, "billing"),
    ]:
        ApiKey.objects.create(tenant=tenant, name=name, prefix=prefix, scopes=["runs"])

    new = _migrate(AFTER)
    names = dict(new.get_model("runs", "ApiKey").objects.values_list("prefix", "name"))
    assert names == {
        "gh_first": "billing",
        "gh_second": "billing (gh_second)",
        "gh_third": "key gh_third",
        "gh_fourth": "billing",
    }
    _migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())
