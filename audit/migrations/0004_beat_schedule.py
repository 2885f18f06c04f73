"""Registers the audit beat jobs with django-celery-beat, once.

`audit.seal` every 60 seconds (stale runs expire rather than pile up) and
`audit.verify` once a day. Running the migration again, or on a database where
an operator already changed the schedule, leaves existing entries alone.
"""

from django.db import migrations

SEAL_TASK = "audit.seal"
VERIFY_TASK = "audit.verify"


def register(apps, schema_editor):
    IntervalSchedule = apps.get_model("django_celery_beat", "IntervalSchedule")
    PeriodicTask = apps.get_model("django_celery_beat", "PeriodicTask")
    PeriodicTasks = apps.get_model("django_celery_beat", "PeriodicTasks")
    from django.utils import timezone

    every_minute, _ = IntervalSchedule.objects.get_or_create(
        every=60, period="seconds"
    )
    every_day, _ = IntervalSchedule.objects.get_or_create(every=1, period="days")
    created = False
    for name, schedule, expires, description in (
        (
            SEAL_TASK,
            every_minute,
            60,
            "Seal new audit events of every tenant into hash-chained blocks.",
        ),
        (
            VERIFY_TASK,
            every_day,
            3600,
            "Recompute every tenant's audit chain and keep the result.",
        ),
    ):
        _, made = PeriodicTask.objects.get_or_create(
            name=name,
            defaults={
                "task": name,
                "interval": schedule,
                "expire_seconds": expires,
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
    PeriodicTask.objects.filter(name__in=[SEAL_TASK, VERIFY_TASK]).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("audit", "0003_append_only_triggers"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]

    operations = [migrations.RunPython(register, unregister)]
