"""Registers every retention job with django-celery-beat, once.

Idempotent: an entry that exists (by name) is left alone, so running the
migration again, or on a database where an operator changed the schedule in
the admin, changes nothing. Two jobs are scheduled by the app that owns them
(`runs.recover_stalled_runs`, `audit.seal`); they are ensured here too, with
the owners' settings, so that the schedule always holds every job.
"""

from django.db import migrations
from django.utils import timezone

# name, every (seconds), description. `expire_seconds` is the interval: a run
# that waited longer than that is dropped rather than piled up.
JOBS = (
    (
        "runs.recover_stalled_runs",
        15,
        "Re-dispatch runs whose worker was lost, and queued runs that no worker "
        "picked up.",
    ),
    (
        "retention.escalate_approvals",
        300,
        "Remind, escalate and finally expire unanswered approval requests along "
        "each tenant's chain; expiry denies and resumes the run.",
    ),
    (
        "retention.close_orphaned_approvals",
        900,
        "Close pending approvals whose thread was deleted, whose run was "
        "cancelled or failed, or whose agent version is gone.",
    ),
    (
        "retention.carry_out_deletions",
        60,
        "Remove the rows of threads whose deletion was requested (their keys are "
        "already destroyed); requests on legal hold wait.",
    ),
    (
        "retention.expire_threads",
        3600,
        "Delete threads idle past their tenant's checkpoint TTL: key shredded, "
        "rows removed, audit trail kept.",
    ),
    (
        "retention.prune_checkpoints",
        3600,
        "Prune each thread's checkpoints to the tenant's keep-latest-N; "
        "interrupted threads keep what they need to resume.",
    ),
    (
        "audit.seal",
        60,
        "Seal new audit events of every tenant into hash-chained blocks.",
    ),
    (
        "retention.purge_audit",
        86400,
        "Purge sealed audit events past each tenant's audit retention, leaving a "
        "record of the purge.",
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
    PeriodicTask.objects.filter(
        name__in=[name for name, _, _ in JOBS if name.startswith("retention.")]
    ).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("retention", "0002_policies_holds_subject_deletion"),
        ("runs", "0004_beat_recover_stalled_runs"),
        ("audit", "0004_beat_schedule"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]

    operations = [migrations.RunPython(register, unregister)]
