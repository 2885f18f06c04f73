"""The checkpoint store's primary keys fill their leaf pages (fillfactor 100,
btree's default is 90).

Their rows are only ever added at the end of their thread's key range
(checkpoint ids grow with time, as do a task's write positions and a
channel's versions), and Postgres splits a leaf page that fills that way at
the fillfactor: the 10% a page keeps free by default is never used, since
no key lands in the middle of a thread's range later. A step of a chat
thread stores about 10 bytes less (docs/benchmarks.md, "Checkpoint store").

Safe on a live table: a storage parameter is a catalog change (SHARE UPDATE
EXCLUSIVE, which reads and writes do not wait for); it applies to pages
split from now on and rewrites nothing. Postgres only: SQLite has no such
setting.
"""

from django.db import migrations

_KEYS = ("runs_checkpoint_pkey", "runs_pendingwrite_pkey", "runs_channelblob_pkey")


def _set(schema_editor, setting: str) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    for index in _KEYS:
        schema_editor.execute(f"ALTER INDEX {index} {setting}")


def forwards(apps, schema_editor):
    _set(schema_editor, "SET (fillfactor = 100)")


def backwards(apps, schema_editor):
    _set(schema_editor, "RESET (fillfactor)")


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0023_channel_blob_natural_key"),
    ]

    operations = [migrations.RunPython(forwards, backwards, elidable=False)]
