"""The Celery application; its settings live in config.settings under CELERY_*."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("gatehouse")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
# Each worker also asks for the recovery sweep of stalled runs: recovery does
# not depend on beat alone. Loaded by name when a worker starts, after Django.
app.steps["worker"].add("runs.bootsteps:RecoverySweep")
