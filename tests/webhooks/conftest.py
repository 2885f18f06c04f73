import pytest

from tests.agent_protocol.conftest import gatehouse_server, sdk  # noqa: F401
from tests.webhooks.receiver import Receiver


@pytest.fixture
def receiver():
    server = Receiver()
    yield server
    server.stop()
