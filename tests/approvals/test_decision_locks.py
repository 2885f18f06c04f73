"""A decision locks its request and its thread, never its tenant: every insert
that references the tenant checks it (FOR KEY SHARE) at commit, some while
holding the tenant's audit sequence, so a tenant lock deadlocks them; and it
locks the thread only for a request still pending."""

import psycopg
import pytest
from django.db import connection, transaction

from approvals.models import ApprovalRequest
from approvals.services.lifecycle import locked_pending
from tests.approvals.helpers import waiting_request
from tests.factories import api_client, make_api_key, make_tenant


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


@pytest.mark.django_db(transaction=True)
def test_a_decision_on_a_request_no_longer_pending_does_not_wait_for_its_thread():
    """Whoever holds the thread may be waiting for the request's row (a worker
    re-opening a cancelled request, a migration moving it): a decision that
    held that row and waited for the thread would deadlock with it. Refused
    with the row alone locked, as before the thread was locked with it."""
    tenant = make_tenant()
    approval = waiting_request(tenant)
    ApprovalRequest.objects.filter(pk=approval.pk).update(status="cancelled")
    _, secret = make_api_key(tenant, ["approvals"])
    with _other_connection() as other:
        other.autocommit = False
        other.execute(
            "SELECT 1 FROM runs_thread WHERE id = %s FOR NO KEY UPDATE",
            (approval.thread_id,),
        )
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '2s'")
        try:
            response = api_client(secret).post(
                f"/api/v1/approvals/{approval.pk}/decision",
                {"approved": True, "reviewer": "ops"},
                format="json",
            )
        finally:
            with connection.cursor() as cursor:
                cursor.execute("RESET lock_timeout")
        other.rollback()
    assert response.status_code == 409, response.content
    assert response.json()["code"] == "already_decided"
