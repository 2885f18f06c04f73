"""One thread that cannot be removed must not stop a job: the other threads of
its batch, of its tenant and of later tenants go on; the failure is counted,
logged without content, and tried again by the next run.

The failure is real: a trigger, created in the test's transaction, refuses
one thread's row (Postgres raises it as it would any constraint of the data).
"""

from __future__ import annotations

import logging
from datetime import timedelta
from io import StringIO

import pytest
import time_machine
from django.core.management import call_command
from django.db import OperationalError, connection
from django.utils import timezone

from audit.models import AuditEvent
from retention.jobs import job_run
from retention.models import ThreadRemoval
from retention.services import retention_policy_set, subject_deletion_request
from runs.models import Checkpoint, Thread
from tests.factories import make_tenant
from tests.retention.helpers import SECRET, TESTS, make_thread, write_checkpoints

pytestmark = pytest.mark.django_db


def _refuse(
    table: str,
    when: str,
    *,
    column: str,
    value: int,
    action: str = "RAISE EXCEPTION 'refused by the test'",
) -> None:
    """A trigger on `table` that raises on `when` (INSERT, DELETE) of the rows
    whose `column` is `value`; it goes with the test's transaction."""
    row = "OLD" if when == "DELETE" else "NEW"
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE FUNCTION gh_refuse() RETURNS trigger LANGUAGE plpgsql AS $$ "
            f"BEGIN IF {row}.{column} = {int(value)} THEN "
            f"{action}; END IF; "
            f"RETURN {row}; END $$"
        )
        cursor.execute(
            f"CREATE TRIGGER gh_refuse BEFORE {when} ON {table} "
            "FOR EACH ROW EXECUTE FUNCTION gh_refuse()"
        )


def _allow(table: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TRIGGER gh_refuse ON {table}")
        cursor.execute("DROP FUNCTION gh_refuse()")


def _expire():
    with time_machine.travel(timezone.now() + timedelta(days=31), tick=False):
        return job_run("expire_threads", batch_size=2)


def _removed(*threads: Thread) -> list[bool]:
    return [
        Thread.objects.get(pk=thread.pk).deleted_at is not None for thread in threads
    ]


def test_a_thread_that_fails_to_expire_holds_back_no_other(caplog):
    first_tenant, next_tenant = make_tenant(), make_tenant()
    for tenant in (first_tenant, next_tenant):
        retention_policy_set(tenant=tenant, actor=TESTS, checkpoint_ttl_days=30)
    # Batches of 2 in pk order: [before, bad] fails, then [after].
    before = make_thread(first_tenant, "before", steps=1)
    bad = make_thread(first_tenant, "bad", steps=1)
    after = make_thread(first_tenant, "after", steps=1)
    other = make_thread(next_tenant, "other", steps=1)
    table = ThreadRemoval._meta.db_table
    _refuse(table, "INSERT", column="thread_id", value=bad.pk)

    with caplog.at_level(logging.INFO):
        report = _expire()

    assert _removed(before, bad, after, other) == [True, False, True, True]
    assert report.counts[first_tenant.pk]["errors"] == 1
    assert report.counts[first_tenant.pk]["threads_expired"] == 2
    assert report.counts[next_tenant.pk]["threads_expired"] == 1
    assert "errors" not in report.counts[next_tenant.pk]
    # The failed thread's work rolled back whole: key, content, tombstone.
    bad.refresh_from_db()
    assert bad.wrapped_data_key is not None
    assert Checkpoint.objects.filter(thread=bad).count() == 1
    trail = AuditEvent.objects.for_tenant(first_tenant)
    assert set(
        trail.filter(kind="thread.deleted").values_list("thread_id", flat=True)
    ) == {"before", "after"}
    ran = trail.get(kind="retention.job_ran")
    assert ran.data["errors"] == 1 and ran.data["threads_expired"] == 2
    failures = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(failures) == 1
    logged = failures[0].getMessage()
    assert f"tenant {first_tenant.pk}" in logged
    assert f"expire_threads: thread pk {bad.pk}" in logged
    assert "ProgrammingError (SQLSTATE P0001)" in logged
    assert "refused by the test" not in caplog.text  # the message stays out
    assert SECRET not in caplog.text

    # The next run tries it again: still refused, counted again ...
    again = _expire()
    assert _removed(bad) == [False]
    assert again.totals["errors"] == 1 and again.totals["threads_expired"] == 0
    # ... and once the cause is gone, it expires.
    _allow(table)
    assert _expire().totals["threads_expired"] == 1
    assert _removed(bad) == [True]


def test_a_thread_that_fails_to_prune_holds_back_no_other():
    first_tenant, next_tenant = make_tenant(), make_tenant()
    for tenant in (first_tenant, next_tenant):
        retention_policy_set(tenant=tenant, actor=TESTS, keep_latest_checkpoints=1)
    threads = {}
    for tenant, name in (
        (first_tenant, "before"),
        (first_tenant, "bad"),
        (first_tenant, "after"),
        (next_tenant, "other"),
    ):
        threads[name] = make_thread(tenant, name, steps=0, with_content=False)
        write_checkpoints(threads[name], 3)
    table = Checkpoint._meta.db_table
    _refuse(table, "DELETE", column="thread_id", value=threads["bad"].pk)

    report = job_run("prune_checkpoints", batch_size=2)

    left = {
        name: Checkpoint.objects.filter(thread=thread).count()
        for name, thread in threads.items()
    }
    assert left == {"before": 1, "bad": 3, "after": 1, "other": 1}
    assert report.counts[first_tenant.pk]["errors"] == 1
    assert report.counts[first_tenant.pk]["threads_pruned"] == 2
    assert report.counts[next_tenant.pk]["threads_pruned"] == 1

    _allow(table)
    assert job_run("prune_checkpoints", batch_size=2).totals["threads_pruned"] == 1
    assert Checkpoint.objects.filter(thread=threads["bad"]).count() == 1


def test_the_command_shows_the_failures():
    tenant = make_tenant()
    retention_policy_set(tenant=tenant, actor=TESTS, checkpoint_ttl_days=30)
    bad = make_thread(tenant, "bad", steps=1)
    make_thread(tenant, "fine", steps=1)
    _refuse(ThreadRemoval._meta.db_table, "INSERT", column="thread_id", value=bad.pk)
    out = StringIO()

    with time_machine.travel(timezone.now() + timedelta(days=31), tick=False):
        call_command("retention_run", "expire_threads", stdout=out)

    assert "1 errors" in out.getvalue() and "1 threads expired" in out.getvalue()
    assert "1 failed and were skipped" in out.getvalue()


@pytest.mark.django_db(transaction=True)
def test_a_database_outage_still_fails_the_whole_job():
    """A connection the server drops mid-batch (57P01) is no fault of the
    thread: the job fails, to be retried whole, and counts no error."""
    tenant = make_tenant()
    retention_policy_set(tenant=tenant, actor=TESTS, checkpoint_ttl_days=30)
    doomed = make_thread(tenant, "doomed", steps=1)
    table = ThreadRemoval._meta.db_table
    _refuse(
        table,
        "INSERT",
        column="thread_id",
        value=doomed.pk,
        action="PERFORM pg_terminate_backend(pg_backend_pid())",
    )
    try:
        with pytest.raises(OperationalError):
            _expire()
    finally:
        connection.close()
        _allow(table)
    assert _removed(doomed) == [False]
    assert _expire().totals["threads_expired"] == 1


def test_a_thread_that_fails_to_be_removed_holds_back_no_other_of_its_request():
    tenant, next_tenant = make_tenant(), make_tenant()
    subject = "jane.doe@example.com"
    # Batches of 2 in pk order: [s-1, bad] fails, then [s-3].
    first = make_thread(tenant, "s-1", steps=1, subject=subject)
    bad = make_thread(tenant, "bad", steps=1, subject=subject)
    last = make_thread(tenant, "s-3", steps=1, subject=subject)
    other = make_thread(next_tenant, "o-1", steps=1, subject=subject)
    request = subject_deletion_request(tenant=tenant, subject=subject, actor=TESTS)
    later_request = subject_deletion_request(
        tenant=next_tenant, subject=subject, actor=TESTS
    )
    table = ThreadRemoval._meta.db_table
    _refuse(table, "INSERT", column="thread_id", value=bad.pk)

    report = job_run("carry_out_deletions", batch_size=2)

    removed = set(ThreadRemoval.objects.values_list("thread_id", flat=True))
    assert removed == {first.pk, last.pk, other.pk}
    assert report.counts[tenant.pk]["errors"] == 1
    assert report.counts[tenant.pk]["threads_removed"] == 2
    request.refresh_from_db()
    later_request.refresh_from_db()
    assert request.is_open and later_request.status == "completed"

    _allow(table)
    assert job_run("carry_out_deletions", batch_size=2).totals["threads_removed"] == 1
    request.refresh_from_db()
    assert request.status == "completed" and request.record["threads_removed"] == 3


def test_a_tenant_whose_audit_purge_fails_holds_back_no_other():
    failing, next_tenant = make_tenant(), make_tenant()
    for tenant in (failing, next_tenant):
        retention_policy_set(
            tenant=tenant, actor=TESTS, checkpoint_ttl_days=1, audit_retention_days=2
        )
        make_thread(tenant, steps=1)
    job_run("seal_audit")
    table = AuditEvent._meta.db_table
    _refuse(table, "DELETE", column="tenant_id", value=failing.pk)

    with time_machine.travel(timezone.now() + timedelta(days=3)):
        report = job_run("purge_audit")

    assert report.counts[failing.pk]["errors"] == 1
    assert "events_purged" not in report.counts[failing.pk]
    assert report.counts[next_tenant.pk]["events_purged"] > 0
    assert AuditEvent.objects.for_tenant(failing).filter(kind="thread.created").exists()
