"""What a commit wakes (a run's task, a run's end) goes out before the rest
of its on-commit work (runs.wakeups)."""

import pytest
from django.db import transaction

from audit.signals import event_recorded
from runs import dispatch, wakeups
from tests.factories import tenant_with_client

pytestmark = pytest.mark.django_db(transaction=True)


def test_wake_ups_go_first_in_their_order_and_a_failing_one_stops_none():
    called = []

    def failing():
        called.append("w2")
        raise RuntimeError("broken")

    with transaction.atomic():
        transaction.on_commit(lambda: called.append("a"))
        wakeups.on_commit(lambda: called.append("w1"))
        transaction.on_commit(lambda: called.append("b"))
        wakeups.on_commit(failing)
        wakeups.on_commit(lambda: called.append("w3"))
        assert called == []
    assert called == ["w1", "w2", "w3", "a", "b"]


def test_a_rolled_back_savepoint_drops_its_wake_up_and_outside_one_it_runs_at_once():
    called = []
    with transaction.atomic():
        transaction.on_commit(lambda: called.append("a"))
        try:
            with transaction.atomic():
                wakeups.on_commit(lambda: called.append("dropped"))
                raise ValueError
        except ValueError:
            pass
        wakeups.on_commit(lambda: called.append("kept"))
    assert called == ["kept", "a"]
    wakeups.on_commit(lambda: called.append("now"))
    assert called[-1] == "now"


def test_a_started_runs_task_is_sent_before_its_audit_events_are_announced(
    monkeypatch,
):
    order = []
    monkeypatch.setattr(
        dispatch, "_send", lambda name, args, options: order.append(("sent", name))
    )

    def announced(sender, event, **kwargs):
        order.append(("announced", event.kind))

    event_recorded.connect(announced, dispatch_uid="test-wakeups")
    try:
        _, client = tenant_with_client()
        thread_id = client.post("/langgraph/threads", {}, format="json").json()[
            "thread_id"
        ]
        order.clear()
        started = client.post(
            f"/langgraph/threads/{thread_id}/runs",
            {
                "assistant_id": "refund",
                "input": {"customer_message": "hi", "order": {"id": "A-3"}},
            },
            format="json",
        )
    finally:
        event_recorded.disconnect(dispatch_uid="test-wakeups")
    assert started.status_code == 200, started.content
    assert order[0] == ("sent", dispatch.EXECUTE_RUN), order
    assert ("announced", "run.queued") in order[1:], order
