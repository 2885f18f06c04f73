"""IdempotencyRecord.thread: the column here, its index and foreign key
constraint in 0027, built without blocking the runs.

Django's AddField would add the column with its constraint inline (`ADD
COLUMN ... REFERENCES runs_thread`, SHARE ROW EXCLUSIVE on runs_thread) and
build its index with a plain CREATE INDEX in the same transaction, holding
that lock, and ACCESS EXCLUSIVE on runs_idempotencyrecord, for the whole
build: with 3M records, 1.5-2.7 s during which every run's claim and finish
(an UPDATE of runs_thread) waited. On Postgres this migration adds only the
nullable column (a catalog change that locks nothing but this table, for no
longer than that change); 0027 (not atomic) builds the index CONCURRENTLY
and adds the constraint NOT VALID, then validates it. Names are those
Django's AddField gives them, so the schema is the same as with AddField.
Elsewhere (SQLite, the embedded mode) it is AddField's own.

The state is AddField's as it is (makemigrations sees no change).
"""

import django.db.models.deletion
from django.db import migrations, models


def thread_field():
    return models.ForeignKey(
        blank=True,
        null=True,
        on_delete=django.db.models.deletion.CASCADE,
        related_name="+",
        to="runs.thread",
    )


class AddColumnOnly(migrations.AddField):
    """AddField, except on Postgres: the column alone, no constraint, no index."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor != "postgresql":
            return super().database_forwards(
                app_label, schema_editor, from_state, to_state
            )
        model = to_state.apps.get_model(app_label, self.model_name)
        field = model._meta.get_field(self.name)
        quote = schema_editor.quote_name
        column_type = field.db_parameters(connection=schema_editor.connection)["type"]
        schema_editor.execute(
            f"ALTER TABLE {quote(model._meta.db_table)} "
            f"ADD COLUMN {quote(field.column)} {column_type} NULL"
        )

    def describe(self):
        return f"{super().describe()} (on Postgres the column only: 0027 adds the rest)"


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0025_key_cache_store"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddField(
                    model_name="idempotencyrecord", name="thread", field=thread_field()
                ),
            ],
            database_operations=[
                AddColumnOnly(
                    model_name="idempotencyrecord", name="thread", field=thread_field()
                ),
            ],
        ),
    ]
