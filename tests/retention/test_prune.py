"""Pruning checkpoints to the latest N, without a worker."""

import pytest

from retention.jobs import job_run
from retention.services import legal_hold_place, retention_policy_set
from runs.checkpointer import DjangoSaver
from runs.models import ChannelBlob, Checkpoint, PendingWrite, Run, Thread
from tests.factories import make_tenant
from tests.retention.helpers import SECRET, TESTS, make_thread, write_checkpoints

pytestmark = pytest.mark.django_db


def history(thread) -> list[str]:
    saver = DjangoSaver(tenant=thread.tenant)
    config = {"configurable": {"thread_id": thread.thread_id, "checkpoint_ns": ""}}
    return [t.config["configurable"]["checkpoint_id"] for t in saver.list(config)]


def test_the_latest_n_checkpoints_stay_whole_and_the_rest_goes():
    tenant = make_tenant()
    retention_policy_set(tenant=tenant, actor=TESTS, keep_latest_checkpoints=3)
    thread = make_thread(tenant, steps=0, with_content=False)
    ids = write_checkpoints(thread, 10)

    report = job_run("prune_checkpoints")

    assert report.totals["checkpoints"] == 7 and report.totals["threads_pruned"] == 1
    assert history(thread) == ids[::-1][:3]
    saver = DjangoSaver(tenant=tenant)
    for checkpoint_id in ids[-3:]:
        config = {
            "configurable": {
                "thread_id": thread.thread_id,
                "checkpoint_ns": "",
                "checkpoint_id": checkpoint_id,
            }
        }
        found = saver.get_tuple(config)  # every blob it uses is still there
        assert found.checkpoint["channel_values"]["messages"][0].startswith(SECRET)
        assert len(found.pending_writes) == 2
    assert set(
        PendingWrite.objects.filter(thread=thread).values_list(
            "checkpoint_id", flat=True
        )
    ) == set(ids[-3:])
    # Blobs: only the versions the kept checkpoints use.
    assert ChannelBlob.objects.filter(thread=thread).count() == 3
    # Pruning again finds nothing to do.
    assert job_run("prune_checkpoints").totals == {}


def test_busy_held_and_delta_threads_are_not_pruned():
    tenant = make_tenant()
    retention_policy_set(tenant=tenant, actor=TESTS, keep_latest_checkpoints=1)
    running = make_thread(tenant, "running", steps=4)
    Run.objects.filter(thread=running).update(status=Run.Status.RUNNING)
    held = make_thread(tenant, "held", steps=4)
    legal_hold_place(tenant=tenant, thread=held, reason="matter", actor=TESTS)
    delta = make_thread(tenant, "delta", steps=4)
    Thread.objects.filter(pk=delta.pk).update(uses_delta_channels=True)
    plain = make_thread(tenant, "plain", steps=4)

    report = job_run("prune_checkpoints")

    assert report.totals["threads_pruned"] == 1
    assert report.totals["threads_busy"] == 1  # the running one, next time
    counts = {
        thread.thread_id: Checkpoint.objects.filter(thread=thread).count()
        for thread in (running, held, delta, plain)
    }
    assert counts == {"running": 4, "held": 4, "delta": 4, "plain": 1}
