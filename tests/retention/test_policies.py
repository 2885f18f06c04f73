"""Retention policies: defaults, validation, audit, and the approval due time."""

from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.test import override_settings

from approvals.policy import policy_for
from audit.models import AuditEvent
from retention.models import RetentionPolicy
from retention.services import retention_policy_set
from tests.factories import make_tenant
from tests.retention.helpers import TESTS

pytestmark = pytest.mark.django_db


@override_settings(
    GATEHOUSE_CHECKPOINT_TTL_DAYS=30,
    GATEHOUSE_KEEP_LATEST_CHECKPOINTS=7,
    GATEHOUSE_APPROVAL_ESCALATE_AFTER_HOURS=2,
)
def test_a_tenant_without_a_policy_gets_the_settings_defaults():
    policy = RetentionPolicy.for_tenant(make_tenant())
    assert policy.pk is None
    assert policy.checkpoint_ttl == timedelta(days=30)
    assert policy.keep_latest_checkpoints == 7
    steps = policy.approval_policy().steps
    assert [(s.name, s.after, s.notify) for s in steps] == [
        ("remind", timedelta(0), ("reviewer",)),
        ("escalate", timedelta(hours=2), ("compliance_officer",)),
    ]
    assert policy.final_action == "deny"


def test_audit_retention_shorter_than_the_checkpoint_ttl_is_refused():
    tenant = make_tenant()
    with pytest.raises(ValidationError) as caught:
        retention_policy_set(
            tenant=tenant, actor=TESTS, checkpoint_ttl_days=90, audit_retention_days=30
        )
    assert "audit_retention_days" in caught.value.message_dict
    assert not RetentionPolicy.objects.filter(tenant=tenant).exists()


def test_audit_retention_under_the_operators_minimum_is_refused(settings):
    settings.GATEHOUSE_AUDIT_RETENTION_MIN_DAYS = 365
    tenant = make_tenant()
    with pytest.raises(ValidationError) as caught:
        retention_policy_set(
            tenant=tenant, actor=TESTS, checkpoint_ttl_days=1, audit_retention_days=364
        )
    assert "GATEHOUSE_AUDIT_RETENTION_MIN_DAYS" in str(
        caught.value.message_dict["audit_retention_days"]
    )
    assert not RetentionPolicy.objects.filter(tenant=tenant).exists()
    retention_policy_set(
        tenant=tenant, actor=TESTS, checkpoint_ttl_days=1, audit_retention_days=365
    )
    assert RetentionPolicy.objects.get(tenant=tenant).audit_retention_days == 365


@pytest.mark.parametrize(
    "values",
    [
        {"checkpoint_ttl_days": 0},
        {"checkpoint_ttl_days": 100_000},
        {"keep_latest_checkpoints": 0},
        {"approval_due_hours_high": 0},
        {"expire_after_hours": 10_000},
        {"escalation_chain": "remind"},
        {"escalation_chain": [{"name": "remind", "after_hours": -1, "notify": []}]},
        {
            "escalation_chain": [
                {"name": "remind", "after_hours": 0, "notify": ["janitor"]}
            ]
        },
        {
            "escalation_chain": [
                {"name": "a", "after_hours": 0, "notify": ["reviewer"]},
                {"name": "a", "after_hours": 0, "notify": ["reviewer"]},
            ]
        },
    ],
)
def test_absurd_values_are_refused(values):
    with pytest.raises(ValidationError):
        retention_policy_set(tenant=make_tenant(), actor=TESTS, **values)


def test_a_policy_change_is_audited_with_the_fields_changed():
    tenant = make_tenant()
    retention_policy_set(tenant=tenant, actor=TESTS, keep_latest_checkpoints=5)
    retention_policy_set(tenant=tenant, actor=TESTS, checkpoint_ttl_days=10)
    changes = AuditEvent.objects.for_tenant(tenant).filter(
        kind="retention.policy_changed"
    )
    assert changes.count() == 2
    assert changes.last().data["fields"] == "checkpoint_ttl_days"
    assert changes.last().data["checkpoint_ttl_days"] == 10


def test_approval_due_time_follows_the_tenant_policy():
    tenant = make_tenant()
    assert policy_for(tenant).due_in("high") == timedelta(hours=4)  # settings
    retention_policy_set(tenant=tenant, actor=TESTS, approval_due_hours_high=1)
    assert policy_for(tenant).due_in("high") == timedelta(hours=1)
    assert policy_for(make_tenant()).due_in("high") == timedelta(hours=4)
