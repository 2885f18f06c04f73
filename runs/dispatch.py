"""Sending work to the Celery workers: the one place runs are dispatched.

A run is queued in the database first (runs.services) and its task is sent
once that transaction commits: a worker never looks for a run that is not
there yet, and a rolled-back run sends nothing. A send that fails because
the broker is down is logged and dropped, never raised: the work is
committed, so the request that queued it succeeded, and the recovery sweep
dispatches queued runs whose message never arrived.
Runs of a thread execute one at a time, in creation order: a run that ends
dispatches the thread's next queued run (runs.execution), and a beat sweep
re-dispatches runs whose worker or task message was lost
(`runs_recover_stalled`). Dispatching twice is harmless: claiming a run is
exclusive.

Tasks are named here, not imported: the tasks (runs.tasks and other apps')
call the code that dispatches, so the code that dispatches names them. The
names are stable; beat's schedule refers to them too.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

from celery import current_app
from django.db import connection, transaction

from runs import outages, selectors, wakeups
from runs.fixed_queries import FixedQuery
from runs.models import Run, Thread

EXECUTE_RUN = "runs.execute_run"
RECOVER_STALLED_RUNS = "runs.recover_stalled_runs"
logger = logging.getLogger(__name__)
# The Postgres advisory lock that one sweep holds at a time ("ghsweep").
_SWEEP_LOCK = int.from_bytes(b"ghsweep", "big")


def task_send_on_commit(name: str, *args: Any, **options: Any) -> None:
    """Send the task `name` when the current transaction commits (at once,
    outside a transaction); `options` are Celery's (`countdown=`, ...)."""
    transaction.on_commit(partial(_send, name, args, options))


# What a send skips of Celery's publishing, which a web request pays after
# its commit (~150 us of CPU of ~700 in all): declaring the queue (kombu
# copies and binds the queue's entities on every publish to find it declared
# already; every task goes to the default queue through the default exchange,
# a Redis list that needs no binding, and each worker declares the queues it
# consumes) and Celery's safe repr of the arguments for the message's
# headers (ours are ids and short texts: repr, cut as Celery cuts it).
_ARGSREPR_MAXSIZE = 1024


def _send(name: str, args: tuple, options: dict) -> None:
    try:
        current_app.tasks[name].apply_async(
            args,
            declare=[],
            argsrepr=repr(args)[:_ARGSREPR_MAXSIZE],
            kwargsrepr="{}",
            **options,
        )
    except outages.BROKER_ERRORS as error:
        # Committed work with no message: the sweep that owns this kind of
        # work (runs_recover_stalled for runs) sends it again.
        logger.warning(
            "task %s%r not sent, the broker is unavailable (%s)",
            name,
            args,
            type(error).__name__,
        )


def run_dispatch(run_id) -> None:
    # Sent ahead of the commit's other callbacks (runs.wakeups): a worker is
    # waiting for it, nobody for the announcements of its audit events.
    wakeups.on_commit(partial(_send, EXECUTE_RUN, (str(run_id),), {}))


# The thread's oldest queued run (its id only), compiled once per process: a
# run's finish looks it up every time (runs.execution), and building the
# query cost more CPU than running it. The argument is the thread's pk.
_NEXT_QUEUED = FixedQuery(
    lambda thread_pk: (
        Run.objects.filter(thread_id=thread_pk, status=Run.Status.QUEUED)
        .order_by("created_at")
        .only("id")[:1]
    ),
    -0x5EED,
)


def thread_dispatch_next(thread: Thread) -> None:
    """Dispatch the thread's oldest queued run, if any."""
    for next_run in _NEXT_QUEUED(thread.pk):
        run_dispatch(next_run.pk)


def _sweep_lock() -> bool:
    """Take the sweep's lock for this transaction; False if another worker
    (or beat's task) is sweeping now. SQLite, one worker, needs none."""
    if connection.vendor != "postgresql":
        return True
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [_SWEEP_LOCK])
        return cursor.fetchone()[0]


def runs_recover_stalled(*, batch_size: int = 200) -> dict[str, int]:
    """Re-dispatch runs whose worker was lost, and queued runs nobody picked up
    (`runs.selectors.stalled_runs` says which).

    A running run whose lease expired is dispatched again; the worker that
    claims it takes it over from its last checkpoint (runs.execution). A
    thread's oldest queued run that lost its task message is dispatched again.
    Beat and every worker ask for this sweep (runs.bootsteps); one runs at a time,
    the others find the lock taken and return at once.
    """
    with transaction.atomic():
        if not _sweep_lock():
            return {"expired_leases": 0, "stalled_queued": 0}
        stalled = selectors.stalled_runs(limit=batch_size)
        for run_id in [*stalled.expired_leases, *stalled.lost_messages]:
            run_dispatch(run_id)
    return {
        "expired_leases": len(stalled.expired_leases),
        "stalled_queued": len(stalled.lost_messages),
    }
