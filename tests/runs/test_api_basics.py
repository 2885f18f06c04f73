import pytest

from tests.factories import tenant_with_client

pytestmark = pytest.mark.django_db


def test_agents_list_with_valid_key():
    _, client = tenant_with_client()
    response = client.get("/api/v1/agents")
    assert response.status_code == 200
    names = {(row["name"], row["version"]) for row in response.json()}
    assert ("echo", "1") in names
    echo = next(row for row in response.json() if row["name"] == "echo")
    assert echo["description"] == "Echoes its input text back; used by the test suite."
