"""Registers `runs.recover_stalled_runs` with django-celery-beat, once.

Every 15 seconds: runs whose worker was lost (lease expired) and queued runs
whose task message was lost are dispatched again. An operator's later change
to the entry is left alone.
"""

from django.db import migrations
from django.utils import timezone

TASK = "runs.recover_stalled_runs"


def register(apps, schema_editor):
    IntervalSchedule = apps.get_model("django_celery_beat", "IntervalSchedule")
    PeriodicTask = apps.get_model("django_celery_beat", "PeriodicTask")
    PeriodicTasks = apps.get_model("django_celery_beat", "PeriodicTasks")
    every, _ = IntervalSchedule.objects.get_or_create(every=15, period="seconds")
    _, created = PeriodicTask.objects.get_or_create(
        name=TASK,
        defaults={
            "task": TASK,
            "interval": every,
            "expire_seconds": 15,
            "description": "Re-dispatch runs whose worker was lost, and queued runs "
            "that no worker picked up.",
        },
    )
    if created:
        PeriodicTasks.objects.update_or_create(
            ident=1, defaults={"last_update": timezone.now()}
        )


def unregister(apps, schema_editor):
    apps.get_model("django_celery_beat", "PeriodicTask").objects.filter(
        name=TASK
    ).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0003_runs_and_tool_calls"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]

    operations = [migrations.RunPython(register, unregister)]
