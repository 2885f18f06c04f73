"""Binds every subscription's wrapped signing secret to its subscription, as
runs 0015 does for threads' data keys (issue 16, finding 12)."""

from django.db import migrations

from runs.storage import legacy_wraps_migration
from webhooks.models import WebhookSubscription


class Migration(migrations.Migration):
    dependencies = [
        ("webhooks", "0002_beat_dispatch_due"),
        ("runs", "0015_data_keys_bound_to_threads"),
    ]

    operations = [
        legacy_wraps_migration(
            "webhooks.WebhookSubscription",
            WebhookSubscription.wrapped_keys[0],
            "webhook signing secret(s)",
        )
    ]
