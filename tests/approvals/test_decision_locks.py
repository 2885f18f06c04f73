"""A decision locks its request and its thread, never its tenant: every insert
that references the tenant checks it (FOR KEY SHARE) at commit, some while
holding the tenant's audit sequence, so a tenant lock deadlocks them."""

import psycopg
import pytest
from django.db import connection, transaction

from approvals.services.lifecycle import locked_pending
from tests.approvals.helpers import waiting_request
from tests.factories import make_tenant


def _other_connection() -> psycopg.Connection:
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    return psycopg.connect(**params, autocommit=True)


@pytest.mark.django_db(transaction=True)
def test_the_decisions_locks_leave_the_tenant_row_free():
    tenant = make_tenant()
    approval = waiting_request(tenant)
    with _other_connection() as other, transaction.atomic():
        locked_pending(approval)
        # What a concurrent commit's foreign-key check asks of the tenant row.
        other.execute("SET lock_timeout = '2s'")
        other.execute(
            "SELECT 1 FROM runs_tenant WHERE id = %s FOR KEY SHARE", (tenant.pk,)
        )
        # The thread itself is locked.
        with pytest.raises(psycopg.errors.LockNotAvailable):
            other.execute(
                "SELECT 1 FROM runs_thread WHERE id = %s FOR UPDATE NOWAIT",
                (approval.thread_id,),
            )
