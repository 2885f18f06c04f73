"""record_with_write(): a write and the event about it, atomically, in one
statement outside a transaction."""

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from audit import events
from audit.models import AuditEvent, AuditSequence
from audit.services import Actor, record_with_write
from runs.models import Tenant
from tests.audit.helpers import seqs_of
from tests.factories import make_tenant

# Outside a transaction: the one-statement path is only taken in autocommit.
pytestmark = pytest.mark.django_db(transaction=True)

SYSTEM = Actor.system("tests")
RENAME = 'UPDATE "runs_tenant" SET "name" = %s WHERE "id" = %s RETURNING "id"'


def _rename(tenant: Tenant, name: str, *, where_id=None):
    return record_with_write(
        RENAME,
        [name, tenant.pk if where_id is None else where_id],
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
    tried = [q for q in captured.captured_queries if q["sql"].startswith("WITH w AS")]
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
