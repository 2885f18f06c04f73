"""The official langgraph-sdk client against a live Gatehouse: the production
server (tests/servers.py) and a real worker (the session's)."""

from __future__ import annotations

import pytest
from langgraph_sdk import get_sync_client

from tests.factories import make_api_key, make_tenant
from tests.servers import LiveServer


@pytest.fixture(scope="module")
def gatehouse_server(django_db_setup, _worker_process):
    server = LiveServer(name="agent-protocol")
    yield server
    server.stop()


@pytest.fixture
def sdk(transactional_db, gatehouse_server, worker):
    """A factory of SDK clients: sdk() for a new tenant's key with every scope,
    sdk(scopes=[...], tenant=...) for others. Each client has `.tenant`."""
    clients = []

    def make(*, scopes: list[str] | None = None, tenant=None):
        tenant = tenant or make_tenant()
        _, secret = make_api_key(tenant, scopes)
        client = get_sync_client(
            url=f"{gatehouse_server.url}/langgraph", api_key=secret
        )
        client.tenant = tenant
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.http.client.close()
