"""Checkpoint.run_id as `compact_id` bytes (16 for a run's UUID), like the
checkpoint ids (0019): converted in place, its partial index rebuilt."""

import importlib

from django.db import migrations

import runs.models.checkpoints
from runs.models.checkpoints import compact_id, id_text

_ids = importlib.import_module("runs.migrations.0019_compact_checkpoint_ids")
_INDEX = "checkpoint_run_id"


def _convert(apps, schema_editor, *, forwards: bool) -> None:
    connection = schema_editor.connection
    model = apps.get_model("runs", "checkpoint")
    table = model._meta.db_table
    schema_editor.execute(f"DROP INDEX IF EXISTS {_INDEX}")
    if connection.vendor == "postgresql":
        schema_editor.execute(
            f"ALTER TABLE {table} ALTER COLUMN run_id TYPE bytea "
            f"USING {_ids._to_bytes_sql('run_id')}"
            if forwards
            else f"ALTER TABLE {table} ALTER COLUMN run_id TYPE varchar(64) "
            f"USING {_ids._to_text_sql('run_id')}"
        )
    else:
        # SQLite: each row rewritten (0019 says why the column type may stay).
        convert = compact_id if forwards else id_text
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT id, run_id FROM {table}")
            rows = [(convert(run_id), pk) for pk, run_id in cursor.fetchall()]
            cursor.executemany(f"UPDATE {table} SET run_id = %s WHERE id = %s", rows)
    if forwards:
        index = next(i for i in model._meta.indexes if i.name == _INDEX)
        schema_editor.add_index(model, index)
    else:
        schema_editor.execute(
            f"CREATE INDEX {_INDEX} ON {table} (run_id) WHERE NOT (run_id = '')"
        )


def forwards(apps, schema_editor):
    _convert(apps, schema_editor, forwards=True)


def backwards(apps, schema_editor):
    _convert(apps, schema_editor, forwards=False)


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0020_checkpoint_natural_keys"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="checkpoint",
                    name="run_id",
                    field=runs.models.checkpoints.CompactIdField(
                        blank=True, default=""
                    ),
                ),
            ],
        ),
        migrations.RunPython(forwards, backwards),
    ]
