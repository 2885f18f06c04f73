"""runs 0013: keys named alike (or not at all) before names were unique get
names of their own, and the constraint holds from then on."""

import pytest

from tests.migrations import migrate_to, migrate_to_latest

BEFORE = [("runs", "0012_thread_step_aliases")]
AFTER = [("runs", "0013_api_key_names_unique")]

pytestmark = pytest.mark.django_db(transaction=True)


def test_duplicate_and_empty_names_are_made_unique():
    old = migrate_to(BEFORE)
    Tenant, ApiKey = old.get_model("runs", "Tenant"), old.get_model("runs", "ApiKey")
    acme, other = (Tenant.objects.create(slug=slug, name=slug) for slug in "ab")
    for prefix, tenant, name in [
        ("gh_first", acme, "billing"),
        ("gh_second", acme, "billing "),
        ("gh_third", acme, ""),
        ("gh_fourth", other, "billing"),
    ]:
        ApiKey.objects.create(tenant=tenant, name=name, prefix=prefix, scopes=["runs"])

    new = migrate_to(AFTER)
    names = dict(new.get_model("runs", "ApiKey").objects.values_list("prefix", "name"))
    assert names == {
        "gh_first": "billing",
        "gh_second": "billing (gh_second)",
        "gh_third": "key gh_third",
        "gh_fourth": "billing",
    }
    migrate_to_latest()
