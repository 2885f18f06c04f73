"""A NUL character in a thread id (or any value a lookup binds) is the
client's error on every path that takes one: Postgres text cannot hold it, so
psycopg refuses the statement, which was a 500."""

import uuid

import pytest

from tests.factories import tenant_with_client

pytestmark = pytest.mark.django_db

RUN = uuid.uuid4()
NUL_THREAD = "a%00b"
PATHS = [
    *(
        (method, f"/api/v1/threads/{NUL_THREAD}{rest}")
        for method, rest in [
            ("get", ""),
            ("delete", ""),
            ("get", "/runs"),
            ("post", "/runs"),
            ("get", f"/runs/{RUN}"),
            ("post", "/resume"),
            ("get", "/state"),
            ("get", "/state/x"),
            ("get", "/history"),
            ("post", "/fork"),
        ]
    ),
    ("get", f"/api/v1/audit/threads/{NUL_THREAD}"),
    *(
        (method, f"/langgraph/threads/{NUL_THREAD}{rest}")
        for method, rest in [
            ("get", ""),
            ("patch", ""),
            ("delete", ""),
            ("post", "/copy"),
            ("get", "/state"),
            ("post", "/state"),
            ("post", "/state/checkpoint"),
            ("post", "/history"),
            ("get", "/runs"),
            ("post", "/runs"),
            ("post", "/runs/wait"),
            ("get", f"/runs/{RUN}"),
            ("get", f"/runs/{RUN}/join"),
            ("post", f"/runs/{RUN}/cancel"),
        ]
    ),
]


@pytest.mark.parametrize(("method", "path"), PATHS)
def test_a_thread_id_with_a_nul_is_a_client_error(method, path):
    _, client = tenant_with_client()
    response = getattr(client, method)(path, {"input": {}}, format="json")
    assert response.status_code in (400, 404), response.content
    assert response.json()["code"] in ("invalid", "not_found")


def test_a_thread_search_by_an_id_with_a_nul_finds_nothing():
    _, client = tenant_with_client()
    response = client.post(
        "/langgraph/threads/search", {"ids": ["a\x00b"]}, format="json"
    )
    assert response.status_code in (200, 400), response.content
    if response.status_code == 200:
        assert response.json() == []
