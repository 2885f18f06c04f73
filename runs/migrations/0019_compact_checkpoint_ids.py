"""Checkpoint and task ids as `compact_id` bytes (16 for a UUID) instead of text.

Converted in place: on Postgres by one rewrite of each table (the unique
indexes are rebuilt with it); elsewhere (SQLite) each row's ids are
rewritten. Ciphertexts are bound to the ids' text, which reads back
unchanged, so nothing is re-encrypted.
"""

from django.db import migrations

import runs.models.checkpoints
from runs.models.checkpoints import compact_id, id_text

# model -> its id columns (old text width)
_COLUMNS = {
    "checkpoint": {"checkpoint_id": 64, "parent_checkpoint_id": 64},
    "pendingwrite": {"checkpoint_id": 64, "task_id": 255},
}
_UUID_PATTERN = "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"


def _to_bytes_sql(column: str) -> str:
    """compact_id in SQL."""
    return (
        f"CASE WHEN {column} = '' THEN ''::bytea "
        f"WHEN {column} ~ '{_UUID_PATTERN}' "
        f"THEN decode(replace({column}, '-', ''), 'hex') "
        f"WHEN octet_length({column}) = 15 "
        f"THEN convert_to({column}, 'UTF8') || '\\x0000'::bytea "
        f"ELSE convert_to({column}, 'UTF8') || '\\x00'::bytea END"
    )


def _to_text_sql(column: str) -> str:
    """id_text in SQL."""
    return (
        f"CASE WHEN octet_length({column}) = 16 "
        f"THEN encode({column}, 'hex')::uuid::text "
        f"ELSE convert_from(rtrim({column}, '\\x00'::bytea), 'UTF8') END"
    )


def _convert(apps, schema_editor, *, forwards: bool) -> None:
    connection = schema_editor.connection
    for model_name, columns in _COLUMNS.items():
        model = apps.get_model("runs", model_name)
        table = model._meta.db_table
        if connection.vendor == "postgresql":
            changes = ", ".join(
                f"ALTER COLUMN {column} TYPE bytea USING {_to_bytes_sql(column)}"
                if forwards
                else f"ALTER COLUMN {column} TYPE varchar({width}) "
                f"USING {_to_text_sql(column)}"
                for column, width in columns.items()
            )
            schema_editor.execute(f"ALTER TABLE {table} {changes}")
            continue
        # Elsewhere (SQLite) a column's declared type is advisory: a BLOB stays
        # a BLOB in it and compares bytewise, so each row's ids are rewritten
        # in place (a later rebuild of the table takes the new types).
        convert = compact_id if forwards else id_text
        names = list(columns)
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT id, {', '.join(names)} FROM {table}")
            rows = [
                (*(convert(value) for value in values), pk)
                for pk, *values in cursor.fetchall()
            ]
            assignments = ", ".join(f"{name} = %s" for name in names)
            cursor.executemany(f"UPDATE {table} SET {assignments} WHERE id = %s", rows)


def forwards(apps, schema_editor):
    _convert(apps, schema_editor, forwards=True)


def backwards(apps, schema_editor):
    _convert(apps, schema_editor, forwards=False)


def _compact_id():
    return runs.models.checkpoints.CompactIdField()


def _optional_compact_id():
    return runs.models.checkpoints.CompactIdField(blank=True, default="")


_FIELDS = {
    ("checkpoint", "checkpoint_id"): _compact_id,
    ("checkpoint", "parent_checkpoint_id"): _optional_compact_id,
    ("pendingwrite", "checkpoint_id"): _compact_id,
    ("pendingwrite", "task_id"): _compact_id,
}


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0018_toolcall_settled_at"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(forwards, backwards)],
            state_operations=[
                migrations.AlterField(model_name=model, name=name, field=field())
                for (model, name), field in _FIELDS.items()
            ],
        ),
    ]
