"""Registers the purge of Idempotency-Key records past their TTL
(`retention.purge_idempotency_records`) with django-celery-beat, once, as
0003 registered the other jobs: an entry that exists (by name) is left alone.
"""

from django.db import migrations
from django.utils import timezone

JOBS = (
    (
        "retention.purge_idempotency_records",
        3600,
        "Delete Idempotency-Key records (and the responses sealed in them) past "
        "GATEHOUSE_IDEMPOTENCY_TTL.",
    ),
)


def register(apps, schema_editor):
    IntervalSchedule = apps.get_model("django_celery_beat", "IntervalSchedule")
    PeriodicTask = apps.get_model("django_celery_beat", "PeriodicTask")
    PeriodicTasks = apps.get_model("django_celery_beat", "PeriodicTasks")
    created = False
    for name, every, description in JOBS:
        interval, _ = IntervalSchedule.objects.get_or_create(
            every=every, period="seconds"
        )
        _, made = PeriodicTask.objects.get_or_create(
            name=name,
            defaults={
                "task": name,
                "interval": interval,
                "expire_seconds": every,
                "description": description,
            },
        )
        created = created or made
    if created:
        # Tells a running beat to reload its schedule.
        PeriodicTasks.objects.update_or_create(
            ident=1, defaults={"last_update": timezone.now()}
        )


def unregister(apps, schema_editor):
    PeriodicTask = apps.get_model("django_celery_beat", "PeriodicTask")
    PeriodicTask.objects.filter(name__in=[name for name, _, _ in JOBS]).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("retention", "0003_beat_schedule"),
    ]

    operations = [migrations.RunPython(register, unregister)]
