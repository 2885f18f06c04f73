"""Binds every thread's wrapped data key to its thread (issue 16, finding
12): a key wrapped before named only its master key and tenant in the wrap's
associated data, so one copied to another thread of the tenant unwrapped
there. Each is rewrapped, under the active master key, in the format that
names the thread (runs.crypto.WRAP_FORMAT); the data key itself, and so
every ciphertext, is unchanged."""

from django.db import migrations

from runs.crypto import THREAD_KEY_OWNER
from runs.models.content import WrappedKey
from runs.storage import legacy_wraps_migration


class Migration(migrations.Migration):
    dependencies = [("runs", "0014_sagas")]

    operations = [
        legacy_wraps_migration(
            "runs.Thread",
            WrappedKey("wrapped_data_key", "data_key_id", owner=THREAD_KEY_OWNER),
            "thread data key(s)",
        )
    ]
