"""The Celery application; its settings live in config.settings under CELERY_*."""

import os

from celery import Celery, signals

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("gatehouse")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
# Each worker also asks for the recovery sweep of stalled runs: recovery does
# not depend on beat alone. Loaded by name when a worker starts, after Django.
app.steps["worker"].add("runs.bootsteps:RecoverySweep")


@signals.task_prerun.connect
@signals.task_postrun.connect
def keep_or_close_connections(sender=None, **kwargs) -> None:
    """Around each task, what Django does around each request: a connection
    past DATABASE_CONN_MAX_AGE, or broken (it is tested after an error), or
    left outside autocommit is closed; the others are kept for the next task
    (and health-checked before their first query, CONN_HEALTH_CHECKS).
    Celery's own closing of every connection is off (CELERY_DB_REUSE_MAX).
    Not for a task run eagerly, inside its caller's transaction."""
    if getattr(getattr(sender, "request", None), "is_eager", False):
        return
    from django.db import close_old_connections

    close_old_connections()
