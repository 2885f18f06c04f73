"""Two clients resume the same input interrupt at the same moment: exactly one
resume runs the next node (and pays), the other is refused with a 409."""

from __future__ import annotations

import threading
from functools import partial

import httpx
import pytest

from audit.models import AuditEvent
from demo.models import DemoPayment
from runs.models import Run

pytestmark = pytest.mark.worker

RACES = 20


def _race(calls):
    """Start the calls at once; each one's result or the exception it raised."""
    barrier = threading.Barrier(len(calls))
    outcomes = [None] * len(calls)

    def contender(index, call):
        barrier.wait()
        try:
            outcomes[index] = call()
        except Exception as exc:  # noqa: BLE001  the refused one is collected
            outcomes[index] = exc

    threads = [
        threading.Thread(target=contender, args=(index, call))
        for index, call in enumerate(calls)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return outcomes


def test_concurrent_resumes_of_one_interrupt_run_the_next_node_once(sdk):
    first = sdk()
    second = sdk(tenant=first.tenant)
    for race in range(RACES):
        thread_id = first.threads.create(metadata={"graph_id": "pay"})["thread_id"]
        first.runs.wait(thread_id, "pay", input={"amount": "10.00"})
        # runs.wait against runs.create, and runs.wait against runs.wait.
        rival = second.runs.create if race % 2 else second.runs.wait
        yes = {"resume": "yes"}
        outcomes = _race(
            [
                partial(first.runs.wait, thread_id, "pay", command=yes),
                partial(rival, thread_id, "pay", command=yes),
            ]
        )
        refused = [o for o in outcomes if isinstance(o, Exception)]
        assert len(refused) == 1, outcomes
        assert isinstance(refused[0], httpx.HTTPStatusError)
        assert refused[0].response.status_code == 409
        winner = next(o for o in outcomes if not isinstance(o, Exception))
        if "run_id" in winner:  # runs.create won: wait for it
            first.runs.join(thread_id, winner["run_id"])
        resumes = Run.objects.filter(thread__thread_id=thread_id, kind=Run.Kind.RESUME)
        assert resumes.count() == 1
        assert resumes.get().status == Run.Status.SUCCEEDED
        assert (
            AuditEvent.objects.filter(
                thread_id=thread_id, kind="run.started", run_id=str(resumes.get().pk)
            ).count()
            == 1
        )
    assert DemoPayment.objects.filter(tenant=first.tenant).count() == RACES
