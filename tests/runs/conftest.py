import pytest

from runs import dispatch


@pytest.fixture
def dispatched(monkeypatch):
    """The runs queued for a worker, in order, instead of sent to the broker:
    the test executes them (runs.execution.execute) in its own process."""
    runs: list[str] = []
    monkeypatch.setattr(dispatch, "run_dispatch", lambda run_id: runs.append(run_id))
    return runs
