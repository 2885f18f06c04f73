"""record_with_write(): a write and the event about it, atomically, in one
statement outside a transaction."""

import contextlib

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connection, transaction
from django.test.utils import CaptureQueriesContext

from audit import events
from audit.models import AuditEvent, AuditSequence
from audit.services import Actor, audit_verify, record_with_write
from runs.models import Tenant
from tests.audit.helpers import seqs_of
from tests.factories import make_tenant

# Outside a transaction: the one-statement path is only taken in autocommit.
pytestmark = pytest.mark.django_db(transaction=True)

SYSTEM = Actor.system("tests")
RENAME = 'UPDATE "runs_tenant" SET "name" = %s WHERE "id" = %s RETURNING "id"'


def _rename(tenant: Tenant, name: str, *, where_id=None):
    return record_with_write(
        (RENAME, [name, tenant.pk if where_id is None else where_id]),
        tenant=tenant,
        kind=events.TENANT_CREATED,
        actor=SYSTEM,
        data={"slug": name},
    )


def test_the_write_and_its_event_are_one_statement_in_autocommit():
    tenant = make_tenant()  # records tenant.created: seq 1
    with CaptureQueriesContext(connection) as captured:
        event, rows = _rename(tenant, "renamed")
    assert len(captured.captured_queries) == 1, captured.captured_queries
    assert rows == [(tenant.pk,)]
    assert event.seq == 2 and event.pk is not None
    assert Tenant.objects.get(pk=tenant.pk).name == "renamed"
    assert AuditEvent.objects.get(pk=event.pk).data == {"slug": "renamed"}
    assert seqs_of(tenant) == [1, 2]


def test_a_write_that_changes_nothing_records_nothing_and_uses_no_number():
    tenant = make_tenant()
    assert _rename(tenant, "nobody", where_id=-1) == (None, [])
    event, _ = _rename(tenant, "renamed")
    assert seqs_of(tenant) == [1, 2] and event.seq == 2
    assert AuditSequence.objects.get(tenant=tenant).last_seq == 2


def test_the_tenants_first_event_writes_once_with_its_event():
    """No sequence row yet: the statement fails whole (never a write without
    its event), the row is created, and the statement runs again."""
    tenant = Tenant.objects.create(slug="no-events-yet", name="x")
    assert not AuditSequence.objects.filter(tenant=tenant).exists()
    with CaptureQueriesContext(connection) as captured:
        event, rows = _rename(tenant, "first")
    tried = [q for q in captured.captured_queries if q["sql"].startswith("WITH w0 AS")]
    assert len(tried) == 2, captured.captured_queries
    assert rows == [(tenant.pk,)] and event.seq == 1
    assert seqs_of(tenant) == [1]


def test_in_a_transaction_it_joins_it_and_rolls_back_with_it():
    tenant = make_tenant()
    with pytest.raises(RuntimeError), transaction.atomic():
        event, _ = _rename(tenant, "rolled back")
        assert event.seq == 2
        raise RuntimeError("the service failed after recording")
    assert Tenant.objects.get(pk=tenant.pk).name != "rolled back"
    event, _ = _rename(tenant, "kept")
    assert event.seq == 2 and seqs_of(tenant) == [1, 2]


def _rename_then(tenant: Tenant, name: str, *, where_id=None, then: int = 2):
    return record_with_write(
        (RENAME, [name, tenant.pk if where_id is None else where_id]),
        tenant=tenant,
        kind=events.TENANT_CREATED,
        actor=SYSTEM,
        data={"slug": name},
        then=[
            {
                "tenant": tenant,
                "kind": events.TENANT_CREATED,
                "actor": SYSTEM,
                "data": {"slug": f"{name}-then-{n}"},
            }
            for n in range(then)
        ],
    )


@pytest.mark.parametrize("atomic", [False, True], ids=["autocommit", "transaction"])
def test_further_events_are_numbered_next_in_the_same_statement(atomic):
    tenant = make_tenant()  # seq 1, its sequence row committed
    within = transaction.atomic() if atomic else contextlib.nullcontext()
    with CaptureQueriesContext(connection) as captured, within:
        event, rows = _rename_then(tenant, "renamed")
    writes = [q for q in captured.captured_queries if q["sql"].startswith("WITH")]
    assert len(writes) == 1, captured.captured_queries
    assert rows == [(tenant.pk,)] and event.seq == 2
    recorded = list(
        AuditEvent.objects.filter(tenant=tenant, seq__gt=1)
        .order_by("seq")
        .values_list("seq", "data")
    )
    assert recorded == [
        (2, {"slug": "renamed"}),
        (3, {"slug": "renamed-then-0"}),
        (4, {"slug": "renamed-then-1"}),
    ]
    assert AuditSequence.objects.get(tenant=tenant).last_seq == 4
    assert audit_verify(tenant=tenant).ok


def test_further_events_are_not_recorded_without_the_write():
    tenant = make_tenant()
    assert _rename_then(tenant, "nobody", where_id=-1) == (None, [])
    assert seqs_of(tenant) == [1]
    assert AuditSequence.objects.get(tenant=tenant).last_seq == 1


def test_further_events_of_another_tenant_are_refused():
    tenant, other = make_tenant(), make_tenant()
    with pytest.raises(ValueError):
        record_with_write(
            (RENAME, ["x", tenant.pk]),
            tenant=tenant,
            kind=events.TENANT_CREATED,
            actor=SYSTEM,
            data={"slug": "x"},
            then=[
                {
                    "tenant": other,
                    "kind": events.TENANT_CREATED,
                    "actor": SYSTEM,
                    "data": {"slug": "y"},
                }
            ],
        )
    assert seqs_of(tenant) == [1] and seqs_of(other) == [1]


RESLUG = 'UPDATE "runs_tenant" SET "slug" = %s WHERE "id" = %s RETURNING "id"'


def test_several_writes_in_a_transaction_are_one_statement_with_the_event():
    tenant = make_tenant()  # its sequence row committed: known to this process
    other = make_tenant()
    with CaptureQueriesContext(connection) as captured, transaction.atomic():
        # Distinct rows: Postgres applies one of two updates of a row in one
        # statement.
        event, rows = record_with_write(
            (RENAME, ["both", tenant.pk]),
            (RESLUG, ["both-slug", other.pk]),
            tenant=tenant,
            kind=events.TENANT_CREATED,
            actor=SYSTEM,
            data={"slug": "both"},
        )
    statements = [q["sql"] for q in captured.captured_queries]
    assert [s for s in statements if s not in ("BEGIN", "COMMIT")] == [
        s for s in statements if s.startswith("WITH w0 AS")
    ]
    assert len([s for s in statements if s.startswith("WITH w0 AS")]) == 1
    assert rows == [(tenant.pk,)] and event.seq == 2
    assert Tenant.objects.get(pk=tenant.pk).name == "both"
    assert Tenant.objects.get(pk=other.pk).slug == "both-slug"


def test_a_write_of_several_that_finds_no_row_fails_them_all():
    tenant = make_tenant()
    with pytest.raises(DatabaseError), transaction.atomic():
        record_with_write(
            (RENAME, ["half", tenant.pk]),
            (RESLUG, ["half-slug", -1]),
            tenant=tenant,
            kind=events.TENANT_CREATED,
            actor=SYSTEM,
            data={"slug": "half"},
        )
    assert Tenant.objects.get(pk=tenant.pk).name != "half"
    assert seqs_of(tenant) == [1]


@pytest.mark.parametrize("seen", [True, False], ids=["one statement", "fallback"])
@pytest.mark.parametrize("missing", [0, 1], ids=["first missing", "second missing"])
def test_a_caller_that_catches_the_failure_of_several_writes_commits_none(
    seen, missing
):
    """On either path, whichever write finds no row: the caller's transaction
    is marked to roll back, so the write that did find its row never commits
    without its event, even if the caller goes on."""
    tenant = make_tenant() if seen else Tenant.objects.create(slug="unseen", name="x")
    writes = [(RENAME, ["half", tenant.pk]), (RESLUG, ["half-slug", tenant.pk])]
    writes[missing][1][1] = -1
    with transaction.atomic():
        try:
            record_with_write(
                *writes,
                tenant=tenant,
                kind=events.TENANT_CREATED,
                actor=SYSTEM,
                data={"slug": "half"},
            )
        except DatabaseError:
            pass  # a caller that goes on, without a savepoint of its own
        assert transaction.get_rollback()
    tenant = Tenant.objects.get(pk=tenant.pk)
    assert (tenant.name, tenant.slug) != ("half", "half-slug")
    assert "half" not in (tenant.name, tenant.slug)
    assert seqs_of(tenant) == ([1] if seen else [])


def test_a_write_without_returning_is_refused_before_it_runs():
    tenant = make_tenant()
    with pytest.raises(ValueError, match="RETURNING"):
        record_with_write(
            ('UPDATE "runs_tenant" SET "name" = %s WHERE "id" = %s', ["x", tenant.pk]),
            tenant=tenant,
            kind=events.TENANT_CREATED,
            actor=SYSTEM,
            data={"slug": "x"},
        )
    assert Tenant.objects.get(pk=tenant.pk).name != "x"


def test_sqlite_without_returning_refuses_to_start():
    """Older SQLite would take a write without RETURNING (Django drops it
    from compiled inserts): the embedded mode refuses it at start-up."""
    from runs.apps import require_sqlite_returning

    require_sqlite_returning()  # this machine's
    with pytest.raises(ImproperlyConfigured, match="3.34.1 is too old"):
        require_sqlite_returning((3, 34, 1))  # tests/settings has a SQLite db


def test_in_a_transaction_a_tenant_without_a_committed_sequence_row_is_served():
    """A tenant this process has not seen numbered: the writes, then record(),
    which creates the sequence row."""
    tenant = Tenant.objects.create(slug="unseen", name="x")
    with transaction.atomic():
        event, rows = _rename(tenant, "first")
    assert rows == [(tenant.pk,)] and event.seq == 1 and seqs_of(tenant) == [1]
