"""runs 0026/0027: IdempotencyRecord.thread added without blocking the runs
on Postgres (no lock on runs_thread beyond a catalog change, the index built
CONCURRENTLY, the constraint added NOT VALID then validated), with the schema
and the state Django's AddField would give."""

import io

import pytest
from django.core.management import call_command
from django.db import IntegrityError, connection, transaction
from django.db.migrations.executor import MigrationExecutor

from tests.migrations import migrate_to, migrate_to_latest

BEFORE = ("runs", "0025_key_cache_store")
COLUMN = ("runs", "0026_idempotency_record_thread")
ONLINE = ("runs", "0027_idempotency_record_thread_online")
TABLE = "runs_idempotencyrecord"

pytestmark = pytest.mark.django_db(transaction=True)


def _sql(migration):
    out = io.StringIO()
    call_command("sqlmigrate", *migration, stdout=out)
    return out.getvalue()


def _djangos_names():
    """The index and constraint names Django's own AddField gives the field."""
    from runs.models import IdempotencyRecord

    field = IdempotencyRecord._meta.get_field("thread")
    with connection.schema_editor() as editor:
        index = editor._create_index_name(TABLE, [field.column], suffix="")
        fk = str(
            editor._fk_constraint_name(
                IdempotencyRecord, field, "_fk_%(to_table)s_%(to_column)s"
            )
        ).strip('"')
    return index, fk


class _RolledBack(Exception):
    pass


def test_the_column_is_added_without_any_lock_on_runs_thread():
    """0026's transaction holds nothing on runs_thread (Django's AddField held
    SHARE ROW EXCLUSIVE on it until its CREATE INDEX was done)."""
    migrate_to([BEFORE])
    executor = MigrationExecutor(connection)
    migration = executor.loader.get_migration(*COLUMN)
    state = executor.loader.project_state([BEFORE])
    held = None
    with pytest.raises(_RolledBack):
        with connection.schema_editor(atomic=True) as editor:
            migration.apply(state, editor)
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT array_agg(mode ORDER BY mode) FROM pg_locks "
                    "WHERE pid = pg_backend_pid() AND relation = 'runs_thread'::regclass"
                )
                held = cursor.fetchone()[0]
            raise _RolledBack
    assert held is None
    migrate_to_latest()


def test_postgres_builds_the_index_concurrently_and_the_constraint_not_valid():
    column, online = _sql(COLUMN), _sql(ONLINE)
    assert "runs_thread" not in column and "CREATE INDEX" not in column
    assert "ADD COLUMN" in column
    index, fk = _djangos_names()
    assert f'CREATE INDEX CONCURRENTLY IF NOT EXISTS "{index}"' in online
    assert f'ADD CONSTRAINT "{fk}" FOREIGN KEY' in online
    assert "DEFERRABLE INITIALLY DEFERRED NOT VALID" in online
    assert f'VALIDATE CONSTRAINT "{fk}"' in online
    assert "BEGIN;" not in online  # not atomic: CONCURRENTLY needs that
    assert MigrationExecutor(connection).loader.get_migration(*ONLINE).atomic is False


def test_the_migrated_schema_is_djangos_and_the_constraint_holds():
    migrate_to_latest()
    index, fk = _djangos_names()
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, TABLE)
        cursor.execute(
            "SELECT condeferrable, condeferred, convalidated FROM pg_constraint "
            "WHERE conrelid = %s::regclass AND conname = %s",
            [TABLE, fk],
        )
        assert cursor.fetchone() == (True, True, True)
        cursor.execute(
            "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)",
            [index],
        )
        assert cursor.fetchone() == (True,)
    assert constraints[fk]["foreign_key"] == ("runs_thread", "id")
    assert constraints[fk]["columns"] == ["thread_id"]
    assert constraints[index]["index"] and constraints[index]["columns"] == [
        "thread_id"
    ]

    from runs.models import IdempotencyRecord, Tenant

    tenant = Tenant.objects.create(slug="fk", name="fk")
    with pytest.raises(IntegrityError), transaction.atomic():
        IdempotencyRecord.objects.create(
            tenant=tenant,
            key="k",
            method="POST",
            path="/",
            request_digest="d",
            thread_id=987654321,
        )


def test_an_interrupted_migration_runs_again():
    """Not atomic, so it may stop between statements: run again, it finishes
    (a constraint left NOT VALID is validated, the index built)."""
    migrate_to_latest()
    migrate_to([COLUMN])
    index, fk = _djangos_names()
    with connection.cursor() as cursor:
        cursor.execute(
            f'ALTER TABLE "{TABLE}" ADD CONSTRAINT "{fk}" FOREIGN KEY ("thread_id") '
            'REFERENCES "runs_thread" ("id") DEFERRABLE INITIALLY DEFERRED NOT VALID'
        )
    migrate_to_latest()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT convalidated FROM pg_constraint WHERE conrelid = %s::regclass "
            "AND conname = %s",
            [TABLE, fk],
        )
        assert cursor.fetchall() == [(True,)]
        cursor.execute(
            "SELECT 1 FROM pg_index WHERE indexrelid = to_regclass(%s)", [index]
        )
        assert cursor.fetchall() == [(1,)]


def test_the_models_need_no_new_migration():
    call_command("makemigrations", "--check", "--dry-run", verbosity=0)
