"""The beat jobs: registered once by a migration, and what they do."""

import importlib

import pytest
from django.apps import apps
from django_celery_beat.models import PeriodicTask

from audit import tasks
from audit.models import AuditBlock
from tests.factories import make_tenant

pytestmark = pytest.mark.django_db
beat_migration = importlib.import_module("audit.migrations.0004_beat_schedule")


def test_seal_runs_every_minute_under_a_stable_task_name():
    entry = PeriodicTask.objects.get(name="audit.seal")
    assert entry.task == "audit.seal" == tasks.seal.name
    assert (entry.interval.every, entry.interval.period) == (60, "seconds")
    assert entry.enabled
    assert PeriodicTask.objects.get(name="audit.verify").task == tasks.verify.name


def test_registering_again_changes_nothing():
    PeriodicTask.objects.filter(name="audit.seal").update(enabled=False)
    beat_migration.register(apps, None)
    beat_migration.register(apps, None)
    assert PeriodicTask.objects.filter(name="audit.seal").count() == 1
    assert not PeriodicTask.objects.get(name="audit.seal").enabled  # left alone


def test_seal_task_seals_and_verify_task_keeps_results():
    tenant = make_tenant()
    assert tasks.seal() == {"tenants": 1, "blocks": 1, "events": 1}
    assert AuditBlock.objects.for_tenant(tenant).count() == 1
    assert tasks.verify()["broken"] == 0
    assert tenant.audit_verifications.get().ok
