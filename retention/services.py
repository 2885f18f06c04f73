"""Retention use cases: policies, legal holds, deletion requests, and removing
threads, which the scheduled jobs repeat in batches (pruning checkpoints is
`runs.storage.checkpoints_prune`).

Removing a thread (expiry, a deletion request): its data key is destroyed
first (`runs.storage.threads_shred`), so everything it stored is unreadable at
once, in backups too; then its checkpoints, channel blobs and pending writes
are deleted (`runs.storage.content_delete`), and the content
other apps keep for it (run inputs, resume values and errors, tool results,
approval payloads, decision notes, reviewer cards, outbox messages) is cleared.
The thread row stays as a tombstone (ids, timestamps), open approvals are
closed, and the audit trail, which holds no content, keeps every event plus a
`thread.deleted` tombstone with the counts; a `ThreadRemoval` row records it
for retention, so a thread is never removed twice.

Locks: a batch locks its threads FOR UPDATE SKIP LOCKED (a thread that a run
is writing to holds FOR KEY SHARE and is passed by until the next sweep), then
their pending approvals SKIP LOCKED: a thread whose approval a reviewer is
deciding at that moment is left for the next sweep, so a sweep never waits on
a person's transaction nor deadlocks with `approval_decide` (which locks the
request, then the thread).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction
from django.db.models import (
    Exists,
    OuterRef,
)
from django.utils import timezone

from approvals.models import ApprovalRequest
from approvals.services import approval_close
from audit import events
from audit.services import Actor, record, thread_tombstone_record
from retention.models import DeletionRequest, LegalHold, RetentionPolicy, ThreadRemoval
from retention.selectors import subject_threads
from runs import dispatch, storage
from runs.errors import InvalidRequest, StateConflict
from runs.models import Run, Tenant, Thread
from runs.services import run_cancel_active
from runs.services.threads import subject_hash

# The tasks that carry out deletion requests (retention.tasks), sent by name.
CARRY_OUT_DELETION = "retention.carry_out_deletion"
CARRY_OUT_DELETIONS = "retention.carry_out_deletions"
RETENTION = Actor.system("retention")
TTL_ACTOR = Actor.system("retention policy (checkpoint TTL)")
# Threads closed per call when a request covers many: each call lists their
# pks in its statements, which take at most 65535 parameters.
_CLOSE_BATCH = 1000

# --- policies ----------------------------------------------------------------------


def policy_for(tenant: Tenant) -> RetentionPolicy:
    return RetentionPolicy.for_tenant(tenant)


POLICY_FIELDS = (
    "checkpoint_ttl_days",
    "keep_latest_checkpoints",
    "audit_retention_days",
    "approval_due_hours_low",
    "approval_due_hours_medium",
    "approval_due_hours_high",
    "escalation_chain",
    "expire_after_hours",
    "final_action",
)


@transaction.atomic
def retention_policy_set(
    *, tenant: Tenant, actor: Actor, **values: Any
) -> RetentionPolicy:
    """Create or change the tenant's policy; ValidationError if it is not sane."""
    unknown = set(values) - set(POLICY_FIELDS)
    if unknown:
        raise TypeError(f"not policy fields: {', '.join(sorted(unknown))}")
    policy = RetentionPolicy.objects.select_for_update().filter(
        tenant=tenant
    ).first() or RetentionPolicy(tenant=tenant)
    before = {name: getattr(policy, name) for name in POLICY_FIELDS}
    for name, value in values.items():
        setattr(policy, name, value)
    return _policy_save(policy, before=before, created=policy.pk is None, actor=actor)


def _policy_save(
    policy: RetentionPolicy, *, before: dict, created: bool, actor: Actor
) -> RetentionPolicy:
    policy.full_clean()
    changed = [
        name
        for name in POLICY_FIELDS
        if created or getattr(policy, name) != before[name]
    ]
    policy.updated_by = actor.label[:200]
    policy.save()
    if changed:
        record(
            tenant=policy.tenant,
            kind=events.RETENTION_POLICY_CHANGED,
            actor=actor,
            data={
                "fields": ", ".join(changed)[:200],
                **{name: _audit_value(getattr(policy, name)) for name in changed},
            },
        )
    return policy


@transaction.atomic
def retention_policy_save(*, policy: RetentionPolicy, actor: Actor) -> RetentionPolicy:
    """Save a policy edited as a model instance (the admin's form)."""
    stored = RetentionPolicy.objects.select_for_update().filter(pk=policy.pk).first()
    before = {name: getattr(stored, name, None) for name in POLICY_FIELDS}
    return _policy_save(policy, before=before, created=stored is None, actor=actor)


def _audit_value(value: Any) -> Any:
    if isinstance(value, list):  # the chain: its shape, in short
        return " > ".join(
            f"{step['name']}+{step['after_hours']}h:{'/'.join(step['notify'])}"
            for step in value
        )[:200]
    return value


# --- legal holds -----------------------------------------------------------------


def held_tenant_ids() -> set[int]:
    return set(
        LegalHold.objects.active().on_tenant().values_list("tenant_id", flat=True)
    )


def tenant_on_hold(tenant: Tenant | int, *, lock: bool = False) -> bool:
    """Whether a tenant-wide hold is active.

    With `lock`, call inside the transaction about to delete the tenant's
    data: it takes the tenant row FOR SHARE first, which a tenant-wide hold
    being placed (FOR NO KEY UPDATE) waits for, and which waits for one, so
    a hold is either seen here or placed after this transaction's deletions.
    """
    tenant_id = tenant if isinstance(tenant, int) else tenant.pk
    if lock and connection.vendor == "postgresql":
        table = connection.ops.quote_name(Tenant._meta.db_table)
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT 1 FROM {table} WHERE id = %s FOR SHARE", [tenant_id]
            )
    return LegalHold.objects.active().on_tenant().filter(tenant_id=tenant_id).exists()


def _hold_target(hold: LegalHold) -> str:
    return f"thread {hold.thread.thread_id}" if hold.thread_id else "the whole tenant"


@transaction.atomic
def legal_hold_place(
    *, tenant: Tenant, reason: str, actor: Actor, thread: Thread | None = None
) -> LegalHold:
    """Hold a thread, or every thread of the tenant, until the hold is lifted."""
    reason = (reason or "").strip()
    if not reason:
        raise InvalidRequest("a legal hold needs a reason", field="reason")
    if thread is None:
        # Sweeps check for a tenant-wide hold under FOR SHARE on this row.
        list(
            Tenant.objects.select_for_update(no_key=True)
            .filter(pk=tenant.pk)
            .values_list("pk", flat=True)
        )
    else:
        thread = Thread.objects.select_for_update().get(pk=thread.pk)
        if thread.tenant_id != tenant.pk:
            raise InvalidRequest("the thread belongs to another tenant", field="thread")
        if thread.deleted_at is not None:
            raise StateConflict(
                f"thread {thread.thread_id} is already deleted; there is nothing "
                "left to hold",
                code="thread_deleted",
            )
        Thread.objects.filter(pk=thread.pk).update(legal_hold=True)
        thread.legal_hold = True
    hold = LegalHold.objects.create(
        tenant=tenant,
        thread=thread,
        reason=reason,
        placed_by_type=actor.type,
        placed_by_id=str(actor.id)[:64],
        placed_by=actor.label[:200],
    )
    record(
        tenant=tenant,
        kind=events.LEGAL_HOLD_PLACED,
        actor=actor,
        thread_id=thread.thread_id if thread else "",
        data={
            "hold_id": hold.pk,
            "target": _hold_target(hold),
            "scope": "thread" if thread else "tenant",
            # A person's free text stays out of the trail; the hold keeps it.
            "with_reason": True,
        },
    )
    return hold


@transaction.atomic
def legal_hold_lift(*, hold: LegalHold, actor: Actor, reason: str = "") -> LegalHold:
    """Lift a hold; the data it covered is subject to retention again, and
    deletion requests waiting on it go ahead at the next sweep."""
    hold = (
        LegalHold.objects.select_for_update(of=("self",))
        .select_related("thread", "tenant")
        .get(pk=hold.pk)
    )
    if hold.lifted_at is not None:
        raise StateConflict("this legal hold is already lifted", code="hold_lifted")
    hold.lifted_at = timezone.now()
    hold.lifted_by = actor.label[:200]
    hold.lift_reason = (reason or "").strip()
    hold.save(update_fields=["lifted_at", "lifted_by", "lift_reason"])
    if hold.thread_id:
        still_held = (
            LegalHold.objects.active().filter(thread_id=hold.thread_id).exists()
        )
        Thread.objects.filter(pk=hold.thread_id).update(legal_hold=still_held)
    record(
        tenant=hold.tenant,
        kind=events.LEGAL_HOLD_LIFTED,
        actor=actor,
        thread_id=hold.thread.thread_id if hold.thread_id else "",
        data={
            "hold_id": hold.pk,
            "target": _hold_target(hold),
            "scope": "thread" if hold.thread_id else "tenant",
        },
    )
    if _has_waiting_requests(hold.tenant_id):
        dispatch.task_send_on_commit(CARRY_OUT_DELETIONS)
    return hold


def _has_waiting_requests(tenant_id: int) -> bool:
    return DeletionRequest.objects.filter(
        tenant_id=tenant_id, status=DeletionRequest.Status.ON_HOLD
    ).exists()


# --- removing threads ------------------------------------------------------------


def _busy_with_a_reviewer(thread_pks: Sequence[int]) -> tuple[set[int], list]:
    """Lock the threads' pending approvals (SKIP LOCKED); the threads one of
    whose approvals is locked by someone else, and the approvals locked."""
    pending = ApprovalRequest.objects.filter(
        thread_id__in=thread_pks, status=ApprovalRequest.Status.PENDING
    )
    locked = list(
        pending.select_related("tenant", "thread")
        .select_for_update(skip_locked=True, of=("self",))
        .order_by("pk")
    )
    locked_pks = {approval.pk for approval in locked}
    busy = {
        thread_pk
        for pk, thread_pk in pending.values_list("pk", "thread_id")
        if pk not in locked_pks
    }
    return busy, [approval for approval in locked if approval.thread_id not in busy]


def threads_close(
    *,
    threads: Sequence[Thread],
    actor: Actor,
    reason: str,
    clear_metadata: bool = False,
) -> tuple[list[Thread], list[Thread]]:
    """Shred the threads now and make them tombstones: the first step of a
    deletion. Runs are cancelled and open approvals closed. Call with the
    threads locked; returns (closed, busy) where busy ones were left alone.
    The metadata and subject index stay unless `clear_metadata` (a subject
    request finds its threads by the index until their rows are removed)."""
    pks = [thread.pk for thread in threads]
    busy, approvals = _busy_with_a_reviewer(pks)
    closed = [thread for thread in threads if thread.pk not in busy]
    for approval in approvals:
        approval_close(approval=approval, reason=reason, actor=actor)
    active = set(
        Run.objects.filter(
            thread_id__in=[t.pk for t in closed], status__in=Run.ACTIVE
        ).values_list("thread_id", flat=True)
    )
    for thread in closed:
        if thread.pk in active:
            run_cancel_active(thread=thread, actor=actor, reason=reason)
    storage.threads_shred(
        thread_pks=[thread.pk for thread in closed], clear_metadata=clear_metadata
    )
    now = timezone.now()
    for thread in closed:
        thread.deleted_at = thread.deleted_at or now
        thread.wrapped_data_key = None
    return closed, [thread for thread in threads if thread.pk in busy]


def threads_remove(
    *,
    threads: Sequence[Thread],
    requested_by: Actor,
    reason: str,
    deletion_request: DeletionRequest | None = None,
) -> tuple[dict[int, dict[str, int]], list[Thread]]:
    """Remove the threads' content for good and leave their tombstones.

    Call in a transaction with the threads locked FOR UPDATE and their legal
    holds checked. Returns ({thread pk: rows removed by kind}, busy threads
    left for the next sweep). Keys are destroyed before any row goes.
    """
    threads, busy = threads_close(
        threads=threads, actor=RETENTION, reason=reason, clear_metadata=True
    )
    pks = [thread.pk for thread in threads]
    if not pks:
        return {}, busy
    removed = storage.content_delete(thread_pks=pks)
    for pk, counts in storage.content_clear(thread_pks=pks).items():
        removed[pk] += counts
    now = timezone.now()
    ThreadRemoval.objects.bulk_create(
        [
            ThreadRemoval(
                thread=thread,
                tenant_id=thread.tenant_id,
                deletion_request=deletion_request,
                reason=reason[:100],
                removed_at=now,
                removed=dict(removed[thread.pk]),
            )
            for thread in threads
        ]
    )
    for thread in threads:
        thread_tombstone_record(
            tenant=thread.tenant,
            thread_id=thread.thread_id,
            actor=RETENTION,
            requested_by=requested_by,
            deletion_request_id=str(deletion_request.pk) if deletion_request else "",
            requested_at=deletion_request.created_at if deletion_request else None,
            removed=removed[thread.pk],
        )
    return {pk: dict(removed[pk]) for pk in pks}, busy


# --- deletion requests ------------------------------------------------------------


def _lock_for_deletion(thread_pks: Iterable[int]) -> list[Thread]:
    """Pending approvals, then threads: approval_decide's lock order, each by
    pk. The set is read once: a subject's threads read by each lock could
    differ by a thread created in between, locked without its approvals
    first. Then locked in lists of ids that fit a statement
    (storage.id_batches), however many threads the subject has."""
    batches = list(storage.id_batches(sorted(set(thread_pks))))
    for batch in batches:
        list(
            ApprovalRequest.objects.filter(
                thread_id__in=batch, status=ApprovalRequest.Status.PENDING
            )
            .select_for_update(of=("self",))
            .order_by("pk")
            .values_list("pk", flat=True)
        )
    return [
        thread
        for batch in batches
        for thread in Thread.objects.select_related("tenant")
        .select_for_update(of=("self",))
        .filter(pk__in=batch)
        .order_by("pk")
    ]


def _requester(actor: Actor) -> dict[str, str]:
    return {
        "requested_by_type": actor.type,
        "requested_by_id": str(actor.id)[:64],
        "requested_by": actor.label[:200],
    }


def _accept(
    *,
    request: DeletionRequest,
    threads: list[Thread],
    actor: Actor,
    target: str,
) -> DeletionRequest:
    """Shred what may be shredded now; the rest waits for its hold."""
    tenant_held = tenant_on_hold(request.tenant_id, lock=True)
    held = [t for t in threads if tenant_held or t.legal_hold]
    free = [t for t in threads if not (tenant_held or t.legal_hold)]
    # Called with pending approvals locked first, so nothing is busy here.
    # In batches: each lists its threads' pks in its statements.
    for start in range(0, len(free), _CLOSE_BATCH):
        threads_close(
            threads=free[start : start + _CLOSE_BATCH],
            actor=actor,
            reason="thread deleted on request",
        )
    request.status = (
        DeletionRequest.Status.ON_HOLD if held else DeletionRequest.Status.SHREDDED
    )
    request.record = {
        "threads_found": len(threads),
        "threads_shredded": len(free),
        "threads_on_hold": len(held),
    }
    if not threads:
        # Said in so many words: an empty record reads like a failure.
        request.record["note"] = "no thread matched"
    request.save(update_fields=["status", "record", "updated_at"])
    _deletion_event(
        request,
        events.DELETION_REQUESTED,
        actor,
        target=target,
        kind=request.kind,
        threads=len(threads),
        status=request.status,
    )
    _schedule_carry_out(request.pk)
    return request


@transaction.atomic
def thread_deletion_request(*, thread: Thread, actor: Actor) -> DeletionRequest:
    """Accept a request to delete a thread: its key is destroyed now, its rows
    removed by the next sweep. A thread under legal hold waits (`on_hold`)."""
    (thread,) = _lock_for_deletion([thread.pk])
    if thread.deleted_at is not None:
        raise StateConflict(
            f"thread {thread.thread_id} is already deleted", code="thread_deleted"
        )
    request = DeletionRequest.objects.create(
        tenant=thread.tenant,
        kind=DeletionRequest.Kind.THREAD,
        thread=thread,
        thread_ref=thread.thread_id,
        status=DeletionRequest.Status.SHREDDED,
        **_requester(actor),
    )
    return _accept(
        request=request,
        threads=[thread],
        actor=actor,
        target=f"thread {thread.thread_id}",
    )


@transaction.atomic
def subject_deletion_request(
    *, tenant: Tenant, subject: str, actor: Actor
) -> DeletionRequest:
    """Accept a request to delete every thread of a data subject.

    Threads are found by the subject's blind index (`Thread.subject_hash`);
    the subject itself is not stored. Their keys are destroyed now (held
    threads excepted), their rows removed by the next sweeps.
    """
    if not isinstance(subject, str) or not subject.strip():
        raise InvalidRequest("subject must be a non-empty string", field="subject")
    request = DeletionRequest.objects.create(
        tenant=tenant,
        kind=DeletionRequest.Kind.SUBJECT,
        subject_hash=subject_hash(subject),
        status=DeletionRequest.Status.SHREDDED,
        **_requester(actor),
    )
    threads = _lock_for_deletion(
        subject_threads(tenant, subject).values_list("pk", flat=True)
    )
    return _accept(
        request=request, threads=threads, actor=actor, target="a data subject"
    )


def request_threads(request: DeletionRequest):
    """The request's threads that have not been removed yet."""
    not_removed = ~Exists(ThreadRemoval.objects.filter(thread_id=OuterRef("pk")))
    if request.kind == DeletionRequest.Kind.SUBJECT:
        threads = Thread.objects.filter(
            tenant_id=request.tenant_id,
            subject_hash=request.subject_hash,
            created_at__lte=request.created_at,
        )
    else:
        threads = Thread.objects.filter(pk=request.thread_id)
    return threads.filter(not_removed)


@dataclass(frozen=True)
class CarryOutStep:
    request: DeletionRequest
    removed: dict[int, dict[str, int]]  # thread pk -> rows removed by kind
    busy: int  # threads left for the next sweep (a reviewer had them locked)


def deletion_carry_out(
    *,
    request: DeletionRequest,
    batch_size: int = 50,
    thread_pks: Sequence[int] | None = None,
) -> CarryOutStep | None:
    """One step of a request: remove up to `batch_size` of its threads (those
    of them among `thread_pks`, if given: the sweep's batch).

    One transaction; the request row is locked SKIP LOCKED, so a second sweep
    passes it by (None). Held threads wait; when only they remain the request
    is `on_hold`; when none remain it is `completed`, with its record.
    """
    with transaction.atomic():
        request = (
            DeletionRequest.objects.select_for_update(skip_locked=True, of=("self",))
            .select_related("tenant")
            .filter(pk=request.pk, status__in=DeletionRequest.OPEN)
            .first()
        )
        if request is None:
            return None
        tenant_held = tenant_on_hold(request.tenant_id, lock=True)
        remaining = request_threads(request)
        if tenant_held:
            candidates = []
        else:
            unheld = remaining.filter(legal_hold=False)
            if thread_pks is not None:
                unheld = unheld.filter(pk__in=list(thread_pks))
            candidates = list(
                unheld.select_related("tenant")
                .select_for_update(skip_locked=True, of=("self",))
                .order_by("pk")[:batch_size]
            )
        requester = Actor(
            type=request.requested_by_type,
            id=request.requested_by_id,
            label=request.requested_by,
        )
        removed, busy = threads_remove(
            threads=candidates,
            requested_by=requester,
            reason="deletion request",
            deletion_request=request,
        )
        totals = Counter(request.record.get("removed", {}))
        for counts in removed.values():
            totals.update(counts)
        by_pk = {thread.pk: thread for thread in candidates}
        threads_done = list(request.record.get("threads", []))
        threads_done += [by_pk[pk].thread_id for pk in removed]
        left = remaining.exclude(pk__in=list(removed)).values_list(
            "legal_hold", flat=True
        )
        held_left = sum(1 for held in left if held or tenant_held)
        request.record = {
            **request.record,
            "removed": dict(totals),
            "threads_removed": len(threads_done),
            "threads": threads_done[-100:],
            "threads_on_hold": held_left,
        }
        if not left:
            request.status = DeletionRequest.Status.COMPLETED
            request.completed_at = timezone.now()
        elif held_left == len(left):
            request.status = DeletionRequest.Status.ON_HOLD
        else:
            request.status = DeletionRequest.Status.SHREDDED
        request.save(update_fields=["status", "record", "completed_at", "updated_at"])
        if request.status == DeletionRequest.Status.COMPLETED:
            _deletion_event(
                request,
                events.DELETION_COMPLETED,
                RETENTION,
                threads=len(threads_done),
                **{f"removed_{name}": rows for name, rows in totals.items()},
            )
        return CarryOutStep(request=request, removed=removed, busy=len(busy))


def _deletion_event(
    request: DeletionRequest, event: events.EventKind, actor: Actor, **data
) -> None:
    """Record an event about a deletion request: it names the request and the
    thread it is for (a subject request names none)."""
    record(
        tenant=request.tenant,
        kind=event,
        actor=actor,
        thread_id=request.thread_ref,
        action="delete",
        data={"deletion_request": str(request.pk), **data},
    )


def _schedule_carry_out(request_pk) -> None:
    """Carry the request out right after this transaction commits (the beat
    job is the safety net: a lost message only delays the removal)."""
    dispatch.task_send_on_commit(CARRY_OUT_DELETION, str(request_pk))
