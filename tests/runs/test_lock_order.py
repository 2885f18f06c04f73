"""Lock order (issue 11): a decision and a worker on the same thread never
deadlock.

A thread waits on two approvals at once (the `duo` agent: two parallel
gates). The first decision queues a resume run, which the worker claims,
executes and finishes at once; the second decision arrives while it does.
Both lock the thread and record audit events (the tenant's audit sequence);
if they took those locks in different orders, Postgres would abort one of
them with a deadlock, and the client would see a 500.
"""

import os
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection

from approvals.models import ApprovalRequest
from runs.models import Run
from tests.factories import api_client, make_api_key, make_tenant
from tests.runs.test_approvals_flow import interrupted_thread
from tests.workers import wait_for

ITERATIONS = int(os.environ.get("GATEHOUSE_RACE_ITERATIONS", "200"))
# Threads racing side by side, each on threads of its own: the tenant's audit
# sequence is shared by all of them, as it is in production.
LANES = 4

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.worker,
    pytest.mark.race,
]


def decide(client, approval) -> int:
    return client.post(
        f"/api/v1/approvals/{approval.pk}/decision",
        {"approved": True, "note": "fine"},
        format="json",
    ).status_code


def race(secret: str, iterations: range) -> list[tuple[int, int]]:
    """Each iteration: a thread waiting on two gates, then both decisions,
    the second while the worker claims, runs and finishes the run that the
    first one queued."""
    client = api_client(secret)
    answers = []
    try:
        for iteration in iterations:
            thread_id = f"race-{iteration}"
            interrupted_thread(client, "duo", thread_id)
            right, left = ApprovalRequest.objects.filter(
                thread__thread_id=thread_id
            ).order_by("-action")
            answers.append((decide(client, right), decide(client, left)))
    finally:
        connection.close()
    return answers


def test_decisions_racing_a_run_of_their_thread_never_deadlock(worker, settings):
    # Four lanes of one key outrun the per-key request budget on an idle
    # machine; the budget is not what this test is about.
    settings.REST_FRAMEWORK = {
        **settings.REST_FRAMEWORK,
        "DEFAULT_THROTTLE_RATES": {"principal": "1000000/minute"},
    }
    tenant = make_tenant()
    _, secret = make_api_key(tenant)
    with ThreadPoolExecutor(LANES) as pool:
        lanes = [
            pool.submit(race, secret, range(lane, ITERATIONS, LANES))
            for lane in range(LANES)
        ]
        answers = [answer for lane in lanes for answer in lane.result()]
    assert answers == [(200, 200)] * ITERATIONS
    wait_for(
        lambda: not Run.objects.filter(status__in=Run.ACTIVE).exists(),
        timeout=120,
        what="the resumed runs to finish",
    )
    resumed = Run.objects.filter(thread__tenant=tenant, kind=Run.Kind.RESUME)
    assert not resumed.filter(status=Run.Status.FAILED).exists()
    assert (
        resumed.filter(status=Run.Status.SUCCEEDED).values("thread").distinct().count()
        == ITERATIONS
    )
