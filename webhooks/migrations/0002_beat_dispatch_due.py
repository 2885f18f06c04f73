"""Registers `webhooks.dispatch_due` with django-celery-beat, once: every
minute, pending deliveries whose attempt is due and whose task message was
lost (or whose worker died mid-attempt) are sent again."""

from django.db import migrations
from django.utils import timezone

TASK = "webhooks.dispatch_due"


def register(apps, schema_editor):
    IntervalSchedule = apps.get_model("django_celery_beat", "IntervalSchedule")
    PeriodicTask = apps.get_model("django_celery_beat", "PeriodicTask")
    PeriodicTasks = apps.get_model("django_celery_beat", "PeriodicTasks")
    every, _ = IntervalSchedule.objects.get_or_create(every=60, period="seconds")
    _, created = PeriodicTask.objects.get_or_create(
        name=TASK,
        defaults={
            "task": TASK,
            "interval": every,
            "expire_seconds": 60,
            "description": "Send webhook deliveries that are due and were not sent.",
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
        ("webhooks", "0001_initial"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]

    operations = [migrations.RunPython(register, unregister)]
