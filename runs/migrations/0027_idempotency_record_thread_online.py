"""IdempotencyRecord.thread's index and foreign key constraint on Postgres,
built without blocking the runs (0026 says why; elsewhere 0026 made both).

Not atomic: each statement commits on its own, so no lock is held from one
to the next.

- CREATE INDEX CONCURRENTLY: SHARE UPDATE EXCLUSIVE on runs_idempotencyrecord
  (its reads and writes go on), nothing on runs_thread. A build that was
  interrupted leaves an invalid index of that name: it is dropped and built
  again when the migration runs again.
- ADD CONSTRAINT ... NOT VALID: SHARE ROW EXCLUSIVE on both tables, for the
  catalog change only (no row is read).
- VALIDATE CONSTRAINT: reads every record, under SHARE UPDATE EXCLUSIVE on
  runs_idempotencyrecord and ROW SHARE on runs_thread, which block neither
  table's reads nor writes.

The names are those Django's AddField gives (its _create_index_name), and the
constraint is DEFERRABLE INITIALLY DEFERRED as Django's are: a database
migrated before this was split is left as it is.
"""

from django.db import migrations

TABLE = "runs_idempotencyrecord"
INDEX = "runs_idempotencyrecord_thread_id_ae3b29e8"
CONSTRAINT = "runs_idempotencyrecord_thread_id_ae3b29e8_fk_runs_thread_id"

FORWARDS = [
    f'CREATE INDEX CONCURRENTLY IF NOT EXISTS "{INDEX}" ON "{TABLE}" ("thread_id")',
    f"""DO $do$ BEGIN
    IF NOT EXISTS (SELECT FROM pg_constraint
                   WHERE conrelid = '"{TABLE}"'::regclass AND conname = '{CONSTRAINT}') THEN
        ALTER TABLE "{TABLE}" ADD CONSTRAINT "{CONSTRAINT}" FOREIGN KEY ("thread_id")
            REFERENCES "runs_thread" ("id") DEFERRABLE INITIALLY DEFERRED NOT VALID;
    END IF;
END $do$""",
    f'ALTER TABLE "{TABLE}" VALIDATE CONSTRAINT "{CONSTRAINT}"',
]

BACKWARDS = [
    f'ALTER TABLE "{TABLE}" DROP CONSTRAINT IF EXISTS "{CONSTRAINT}"',
    f'DROP INDEX CONCURRENTLY IF EXISTS "{INDEX}"',
]


class PostgresOnline(migrations.operations.base.Operation):
    """FORWARDS on Postgres, one statement at a time; nothing elsewhere."""

    reversible = True
    reduces_to_sql = True

    def state_forwards(self, app_label, state):
        pass

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor != "postgresql":
            return
        if not schema_editor.collect_sql:
            with schema_editor.connection.cursor() as cursor:
                cursor.execute(
                    "SELECT NOT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)",
                    [INDEX],
                )
                invalid = cursor.fetchone()
            if invalid and invalid[0]:
                schema_editor.execute(f'DROP INDEX CONCURRENTLY "{INDEX}"', None)
        for sql in FORWARDS:
            schema_editor.execute(sql, None)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor != "postgresql":
            return
        for sql in BACKWARDS:
            schema_editor.execute(sql, None)

    def describe(self):
        return (
            "On Postgres: idempotencyrecord.thread's index (CONCURRENTLY) and "
            "foreign key (NOT VALID, then VALIDATE)"
        )


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("runs", "0026_idempotency_record_thread"),
    ]

    operations = [PostgresOnline()]
