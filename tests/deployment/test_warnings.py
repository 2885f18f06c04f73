"""The development-key warnings: in /readyz and on the admin's front page when
the embedded mode's generated keys are in use, nowhere otherwise."""

import pytest

from runs import crypto
from tests.factories import api_client, make_superuser

pytestmark = pytest.mark.django_db


@pytest.fixture
def development_keys(settings, tmp_path):
    settings.GATEHOUSE_DEVELOPMENT_KEY_FILES = {
        "GATEHOUSE_MASTER_KEYS": tmp_path / "master.key",
        "GATEHOUSE_AUDIT_KEYS": tmp_path / "audit.key",
    }
    return crypto.development_key_warnings()


def test_readyz_warns_about_each_development_key(development_keys):
    body = api_client().get("/readyz").json()
    assert body["status"] == "ok"
    assert body["warnings"] == development_keys
    assert "master.key" in development_keys[0] and "audit.key" in development_keys[1]


def test_readyz_has_no_warning_with_key_rings_set():
    assert api_client().get("/readyz").json()["warnings"] == []


def test_admin_index_shows_the_development_key_banner(client, development_keys):
    client.force_login(make_superuser())
    page = client.get("/admin/").content.decode()
    assert 'id="deployment-warnings"' in page
    assert all(warning in page for warning in development_keys)


def test_admin_index_has_no_banner_with_key_rings_set(client):
    client.force_login(make_superuser())
    page = client.get("/admin/").content.decode()
    assert "deployment-warnings" not in page
