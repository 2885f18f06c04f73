"""record(): sequence numbers, actors, and the rule on personal data."""

import datetime
import decimal

import pytest
import time_machine
from django.db import transaction

from audit import events
from audit.models import AuditEvent, AuditSequence
from audit.redaction import describe
from audit.services import Actor, record
from runs.models import ApiKey
from tests.audit.helpers import seqs_of
from tests.factories import make_api_key, make_tenant

pytestmark = pytest.mark.django_db

SYSTEM = Actor.system("tests")


def test_sequence_numbers_are_per_tenant_and_gap_free():
    tenant_a, tenant_b = make_tenant(), make_tenant()  # each records tenant.created
    for _ in range(3):
        record(
            tenant=tenant_a,
            kind=events.TENANT_CREATED,
            actor=SYSTEM,
            data={"slug": "x"},
        )
    record(
        tenant=tenant_b, kind=events.TENANT_CREATED, actor=SYSTEM, data={"slug": "y"}
    )
    assert seqs_of(tenant_a) == [1, 2, 3, 4]
    assert seqs_of(tenant_b) == [1, 2]
    assert AuditSequence.objects.get(tenant=tenant_a).last_seq == 4


def test_rolled_back_event_leaves_no_gap():
    tenant = make_tenant()
    with pytest.raises(RuntimeError), transaction.atomic():
        record(
            tenant=tenant, kind=events.TENANT_CREATED, actor=SYSTEM, data={"slug": "x"}
        )
        raise RuntimeError("the service failed after recording")
    record(tenant=tenant, kind=events.TENANT_CREATED, actor=SYSTEM, data={"slug": "x"})
    assert seqs_of(tenant) == [1, 2]


def test_time_never_goes_backwards_as_the_sequence_goes_forwards():
    tenant = make_tenant()
    for _ in range(20):
        record(
            tenant=tenant, kind=events.TENANT_CREATED, actor=SYSTEM, data={"slug": "x"}
        )
    times = list(
        AuditEvent.objects.for_tenant(tenant)
        .order_by("seq")
        .values_list("occurred_at", flat=True)
    )
    assert times == sorted(times)


def test_a_clock_going_back_does_not_take_the_trail_back():
    """Another server's clock, or an NTP step: time order stays seq order."""
    tenant = make_tenant()
    later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=2)
    with time_machine.travel(later, tick=False):
        first = record(tenant=tenant, kind=events.TENANT_CREATED, actor=SYSTEM,
                       data={"slug": "x"})  # fmt: skip
    second = record(tenant=tenant, kind=events.TENANT_CREATED, actor=SYSTEM,
                    data={"slug": "x"})  # fmt: skip
    first.refresh_from_db()
    second.refresh_from_db()
    assert first.occurred_at == later
    assert second.seq == first.seq + 1 and second.occurred_at == later


def test_undeclared_kind_is_refused():
    tenant = make_tenant()
    with pytest.raises(ValueError, match="undeclared"):
        record(tenant=tenant, kind=events.EventKind("made.up", "x"), actor=SYSTEM)


def test_summary_missing_its_data_names_the_key():
    tenant = make_tenant()
    with pytest.raises(ValueError, match="slug"):
        record(tenant=tenant, kind=events.TENANT_CREATED, actor=SYSTEM, data={})


def test_summary_may_name_the_thread_and_the_actor():
    tenant = make_tenant()
    event = record(
        tenant=tenant,
        kind=events.THREAD_DELETED,
        actor=SYSTEM,
        thread_id="case-9",
        data={"requested_by": "rita"},
    )
    assert event.summary.startswith("thread case-9 deleted on request of rita")


def test_nested_mapping_in_data_is_refused():
    """Raw tool arguments are how personal data would leak in whole."""
    tenant = make_tenant()
    with pytest.raises(ValueError, match="describe"):
        record(
            tenant=tenant,
            kind=events.TENANT_CREATED,
            actor=SYSTEM,
            data={"slug": "x", "args": {"email": "ann@example.com"}},
        )
    assert not AuditEvent.objects.for_tenant(tenant).filter(seq__gt=1).exists()


def test_long_free_text_in_data_is_refused():
    tenant = make_tenant()
    with pytest.raises(ValueError, match="characters"):
        record(
            tenant=tenant,
            kind=events.TENANT_CREATED,
            actor=SYSTEM,
            data={"slug": "x", "message": "Dear support, " + "my story " * 40},
        )


def test_described_arguments_are_stored_as_digests_and_safe_fields():
    tenant = make_tenant()
    args = {"order_id": "A-1001", "amount": decimal.Decimal("40.00"), "iban": "FR76 1"}
    event = record(
        tenant=tenant,
        kind=events.TENANT_CREATED,
        actor=SYSTEM,
        data={"slug": "x", "args": describe(args, safe_keys={"order_id", "amount"})},
    )
    event.refresh_from_db()
    assert event.data["args"]["order_id"] == "A-1001"
    assert event.data["args"]["amount"] == "40.00"
    assert event.data["args"]["iban"].startswith("hmac-sha256:")


def test_api_key_actor_keeps_the_label_it_sent_marked_unverified():
    tenant = make_tenant()
    api_key, _ = make_api_key(tenant, name="chat bot")
    actor = Actor.api_key(ApiKey.objects.get(pk=api_key.pk), on_behalf_of="rita")
    event = record(
        tenant=tenant, kind=events.TENANT_CREATED, actor=actor, data={"slug": "x"}
    )
    event.refresh_from_db()
    assert event.actor_type == "api_key"
    assert event.actor_id == str(api_key.pk)
    assert event.actor_on_behalf_of == "rita"
    assert event.actor_label == (
        f"key {api_key.prefix} (chat bot), unverified label rita"
    )


def test_actor_label_reads_after_the_key_is_gone():
    tenant = make_tenant()
    api_key, _ = make_api_key(tenant, name="crm")
    event = record(
        tenant=tenant,
        kind=events.TENANT_CREATED,
        actor=Actor.api_key(api_key),
        data={"slug": "x"},
    )
    ApiKey.objects.filter(pk=api_key.pk).delete()
    event.refresh_from_db()
    assert event.actor_label == f"key {api_key.prefix} (crm)"


@pytest.mark.django_db(transaction=True)
def test_receivers_look_up_once_per_commit_and_never_across_commits():
    """once_per_commit: the events one transaction committed share a lookup;
    a rolled-back transaction or savepoint lends its batch to no other."""
    from audit.services import once_per_commit
    from audit.signals import event_recorded

    tenant = make_tenant()
    lookups: list[int] = []
    seen: list[tuple[int, int]] = []

    def receiver(sender, *, event, **kwargs):
        def lookup():
            lookups.append(event.pk)
            return len(lookups)

        seen.append((event.pk, once_per_commit(event, ("test", tenant.pk), lookup)))

    def event():
        return record(
            tenant=tenant, kind=events.TENANT_CREATED, actor=SYSTEM, data={"slug": "x"}
        )

    event_recorded.connect(receiver, dispatch_uid="test-once-per-commit")
    try:
        with transaction.atomic():
            first, second = event(), event()
        with pytest.raises(RuntimeError), transaction.atomic():
            event()
            raise RuntimeError("rolled back: never announced")
        with transaction.atomic():
            with pytest.raises(RuntimeError), transaction.atomic():
                event()
                raise RuntimeError("its savepoint rolled back")
            third = event()
        fourth = event()  # a transaction of its own
    finally:
        event_recorded.disconnect(dispatch_uid="test-once-per-commit")
    assert seen == [(first.pk, 1), (second.pk, 1), (third.pk, 2), (fourth.pk, 3)]
    assert lookups == [first.pk, third.pk, fourth.pk]
