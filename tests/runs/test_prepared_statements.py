"""On Postgres the parameters travel apart from the SQL and a recurring query
is prepared on its connection (config.settings, DATABASE_PREPARED_STATEMENTS):
Postgres plans it once per connection, not at every call."""

import pytest
from django.db import connection

from runs.models import Thread

pytestmark = pytest.mark.django_db


def _prepared() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [row[0] for row in cursor.fetchall()]


def test_a_query_run_a_sixth_time_on_a_connection_is_prepared_with_its_parameters():
    def query():
        return list(Thread.objects.filter(thread_id="not-there", tenant_id=-1))

    for _ in range(5):
        query()
    assert not [s for s in _prepared() if "not-there" in s or '"runs_thread"' in s]
    query()
    (statement,) = [s for s in _prepared() if '"runs_thread"' in s]
    assert "$1" in statement and "not-there" not in statement
