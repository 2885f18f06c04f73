"""Sealing alongside event writers and other sealers: no gaps, no duplicates,
no deadlocks, and nobody waits for a sealer. Each thread has its own
database connection, so these tests commit for real."""

import random
import threading
import time

import pytest
from django.db import connection, transaction

from audit import events, sealing
from audit.models import AuditBlock, AuditChainHead, AuditEvent
from audit.services import Actor, record
from tests.factories import make_tenant

pytestmark = pytest.mark.django_db(transaction=True)
AGENT = Actor.agent("refund")


class Worker(threading.Thread):
    """A thread that records its exception and closes its connection."""

    def __init__(self, target) -> None:
        super().__init__(daemon=True)
        self.work = target
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.work()
        except BaseException as exc:  # reported by the test
            self.error = exc
        finally:
            connection.close()


def record_one(tenant, n: int) -> None:
    record(
        tenant=tenant,
        kind=events.TENANT_CREATED,
        actor=AGENT,
        thread_id=f"case-{n % 7}",
        data={"slug": f"s{n}"},
    )


class Rollback(Exception):
    pass


def test_sealing_alongside_writers_and_other_sealers_loses_nothing():
    tenants = [make_tenant() for _ in range(3)]
    committed = {tenant.pk: 1 for tenant in tenants}  # tenant.created
    lock = threading.Lock()
    writing = threading.Event()
    writing.set()

    def writer(seed: int) -> None:
        rng = random.Random(seed)
        for n in range(60):
            tenant = rng.choice(tenants)
            try:
                with transaction.atomic():
                    record_one(tenant, n)
                    time.sleep(rng.random() / 500)  # hold the sequence lock
                    if rng.random() < 0.15:
                        raise Rollback  # a service that fails after recording
            except Rollback:
                continue
            with lock:
                committed[tenant.pk] += 1

    def sealer() -> None:
        while writing.is_set():
            sealing.seal_all()
            time.sleep(0.002)

    writers = [Worker(lambda seed=seed: writer(seed)) for seed in range(4)]
    sealers = [Worker(sealer) for _ in range(3)]
    for thread in sealers + writers:
        thread.start()
    for thread in writers:
        thread.join(timeout=120)
    writing.clear()
    for thread in sealers:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in writers + sealers), "deadlock"
    assert [t.error for t in writers + sealers] == [None] * 7

    sealing.seal_all()
    for tenant in tenants:
        seqs = list(
            AuditEvent.objects.for_tenant(tenant)
            .order_by("seq")
            .values_list("seq", flat=True)
        )
        assert seqs == list(range(1, committed[tenant.pk] + 1))
        ranges = list(
            AuditBlock.objects.for_tenant(tenant)
            .order_by("first_seq")
            .values_list("first_seq", "last_seq")
        )
        covered = [seq for first, last in ranges for seq in range(first, last + 1)]
        assert covered == seqs  # contiguous, no overlap, nothing left out
        check = sealing.verify_tenant(tenant_id=tenant.pk)
        assert check.ok, check.problem
        assert check.unsealed == 0


def test_sealing_does_not_wait_for_a_writer_and_skips_its_open_event():
    tenant = make_tenant()
    recorded, release = threading.Event(), threading.Event()

    def slow_writer() -> None:
        with transaction.atomic():
            record_one(tenant, 1)  # seq 2, its lock held until commit
            recorded.set()
            release.wait(timeout=30)

    writer = Worker(slow_writer)
    writer.start()
    assert recorded.wait(timeout=10)
    try:
        started = time.monotonic()
        sealing.seal_all()
        assert time.monotonic() - started < 5  # did not queue behind the writer
        assert list(
            AuditBlock.objects.for_tenant(tenant).values_list("first_seq", "last_seq")
        ) == [(1, 1)]
    finally:
        release.set()
        writer.join(timeout=30)
    assert writer.error is None
    sealing.seal_all()
    assert AuditChainHead.objects.get(tenant=tenant).last_seq == 2


def test_a_second_sealer_skips_a_tenant_being_sealed():
    tenant = make_tenant()
    sealing.seal_all()
    record_one(tenant, 2)
    holding, release = threading.Event(), threading.Event()

    def busy_sealer() -> None:
        with transaction.atomic():
            AuditChainHead.objects.select_for_update().get(tenant=tenant)
            holding.set()
            release.wait(timeout=30)

    other = Worker(busy_sealer)
    other.start()
    assert holding.wait(timeout=10)
    try:
        started = time.monotonic()
        assert sealing.seal_tenant(tenant_id=tenant.pk) == 0
        assert time.monotonic() - started < 5
    finally:
        release.set()
        other.join(timeout=30)
    assert sealing.seal_tenant(tenant_id=tenant.pk) == 1
