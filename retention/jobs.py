"""The scheduled jobs: what each does, in bounded batches, and the runner.

Every job is a function `(Sweep) -> SweepResult` that works in batches, each one transaction that locks its rows
FOR UPDATE SKIP LOCKED (Postgres): two runs at once never handle one row
twice and never wait for each other, and a run killed midway loses only its
open batch, which the next run does again. A dry run reads the same rows
without locking or changing anything and lists what it would do. A step that
fails (a batch, then each of its threads alone; an approval; a tenant) is
counted as `errors`, logged and skipped, and the job goes on
(runs.sweeps.batch_or_each, isolated); a database outage fails the job.

`job_run()` runs one job and records one `retention.job_ran` audit event with
its counts in each tenant it changed something for (the trail is per tenant,
and a tenant's trail never holds another tenant's figures); a run that changed
nothing records nothing. The Celery tasks (retention.tasks) and
`manage.py retention_run` both go through it.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Exists, OuterRef, Q, Subquery
from django.utils import timezone

from approvals.sweeps import approvals_close_orphaned, approvals_escalate
from audit import events, sealing
from audit import selectors as audit_selectors
from audit.services import Actor, purge_before, record
from retention import services
from retention.models import DeletionRequest
from runs import dispatch, selectors, storage
from runs.models import Checkpoint, IdempotencyRecord, Run, Tenant, Thread
from runs.sweeps import (
    Progress,
    Sweep,
    SweepResult,
    after,
    batch_or_each,
    isolated,
    out_of_time,
)

logger = logging.getLogger(__name__)

# Threads looked at per candidate query of the pruning job (no locks taken).
PRUNE_SCAN_PAGE = 2000
# Idempotency-Key records deleted per batch, per thread of a batch of the
# thread jobs: a record is one small row, with no audit event of its own.
RECORDS_PER_BATCH_ITEM = 20


def _tenants(*, skip_held: bool = True) -> list[Tenant]:
    held = services.held_tenant_ids() if skip_held else set()
    return [tenant for tenant in Tenant.objects.order_by("pk") if tenant.pk not in held]


def _active_run() -> Exists:
    return Exists(Run.objects.filter(thread_id=OuterRef("pk"), status__in=Run.ACTIVE))


# --- expire threads past their TTL ----------------------------------------------


def expirable_threads(tenant: Tenant, now: datetime):
    """The tenant's threads past their TTL that nothing is running on.

    A thread expires `checkpoint_ttl_days` after its last activity: the
    latest change of its row (every run touches it) or its latest checkpoint,
    whichever is later; a thread's own `expires_at`, when set, wins. Threads
    under legal hold never expire.
    """
    cutoff = now - services.policy_for(tenant).checkpoint_ttl
    # The latest root checkpoint: one step back along the checkpoint index
    # (ids grow with time), not a scan of the thread's history.
    latest_checkpoint = Subquery(
        Checkpoint.objects.filter(thread_id=OuterRef("pk"), checkpoint_ns="")
        .order_by("-checkpoint_id")
        .values("created_at")[:1]
    )
    idle = Q(expires_at__isnull=True, updated_at__lt=cutoff) & (
        Q(latest_checkpoint__isnull=True) | Q(latest_checkpoint__lt=cutoff)
    )
    return (
        Thread.objects.filter(tenant=tenant, deleted_at__isnull=True, legal_hold=False)
        .annotate(latest_checkpoint=latest_checkpoint)
        .filter(Q(expires_at__lte=now) | idle)
        .exclude(_active_run())
    )


def expire_threads(sweep: Sweep) -> SweepResult:
    """Shred and remove threads idle past their TTL; their audit trail stays."""
    result = SweepResult()
    for tenant in _tenants():
        with isolated(result, tenant.pk, "expire_threads: the tenant"):
            candidates = expirable_threads(tenant, sweep.now)
            if sweep.dry_run:
                _plan_expiry(result, tenant, candidates)
            else:
                _expire_tenant(sweep, result, tenant, candidates)
    return result


def _plan_expiry(result: SweepResult, tenant: Tenant, candidates) -> None:
    found = candidates.annotate(checkpoint_rows=Count("checkpoints")).values_list(
        "thread_id", "checkpoint_rows"
    )
    for thread_id, rows in found.iterator():
        result.add(tenant.pk, "threads_expired")
        result.add(tenant.pk, "checkpoints", rows)
        result.plan.append(
            f"expire thread {tenant.slug}/{thread_id} ({rows} checkpoints)"
        )


def _expire_tenant(sweep: Sweep, result: SweepResult, tenant: Tenant, candidates):
    lockable = (
        candidates.select_related("tenant")
        .select_for_update(skip_locked=True, of=("self",))
        .order_by("pk")
    )

    def expire(pks: list[int]) -> Counter | None:
        with transaction.atomic():
            if services.tenant_on_hold(tenant, lock=True):
                return None  # placed since the run started
            return _expire(list(lockable.filter(pk__in=pks)))

    cursor = 0
    while not sweep.out_of_time():
        pks = list(
            candidates.filter(pk__gt=cursor)
            .order_by("pk")
            .values_list("pk", flat=True)[: sweep.batch_size]
        )
        if not pks:
            return
        # The cursor passes a thread that failed: the next run, from 0 again,
        # tries it again, and it holds back no later thread meanwhile.
        if not batch_or_each(
            result, tenant.pk, pks, expire, what="expire_threads: thread pk"
        ):
            return
        cursor = pks[-1]
        sweep.tick(len(pks))


def _expire(threads: list[Thread]) -> Counter:
    """Remove `threads` (locked, in the caller's transaction); the counts."""
    removed, busy = services.threads_remove(
        threads=threads, requested_by=services.TTL_ACTOR, reason="checkpoint TTL"
    )
    counts: Counter = Counter()
    for rows in removed.values():
        counts["threads_expired"] += 1
        counts.update(rows)
    if busy:
        counts["threads_busy"] += len(busy)
    return counts


# --- prune checkpoints to the latest N ------------------------------------------


def _prunable(tenant: Tenant):
    return Thread.objects.filter(
        tenant=tenant,
        deleted_at__isnull=True,
        wrapped_data_key__isnull=False,
        legal_hold=False,
        uses_delta_channels=False,
    )


def prune_checkpoints(sweep: Sweep) -> SweepResult:
    """Keep each thread's latest N checkpoints (its tenant's policy).

    Threads with a queued or running run are left for the next run; the
    latest checkpoint of a thread and its pending writes always stay, so an
    interrupted thread resumes as before. Threads that use DeltaChannels are
    never pruned: their earlier checkpoints are part of their value.
    """
    result = SweepResult()
    for tenant in _tenants():
        with isolated(result, tenant.pk, "prune_checkpoints: the tenant"):
            _prune_tenant(sweep, result, tenant)
    return result


def _prune_tenant(sweep: Sweep, result: SweepResult, tenant: Tenant) -> None:
    keep = services.policy_for(tenant).keep_latest_checkpoints
    threads = _prunable(tenant)

    def prune(pks: list[int]) -> Counter | None:
        with transaction.atomic():
            if services.tenant_on_hold(tenant, lock=True):
                return None  # placed since the run started
            return _prune(threads, pks, keep)

    cursor = 0
    while not sweep.out_of_time():
        page = list(
            threads.filter(pk__gt=cursor)
            .order_by("pk")
            .values_list("pk", flat=True)[:PRUNE_SCAN_PAGE]
        )
        if not page:
            return
        cursor = page[-1]
        over = sorted(
            {
                row["thread_id"]
                for row in selectors.namespaces_over(thread_pks=page, keep=keep)
            }
        )
        for start in range(0, len(over), sweep.batch_size):
            if sweep.out_of_time():
                return
            chunk = over[start : start + sweep.batch_size]
            if sweep.dry_run:
                _plan_prune(result, tenant, chunk, keep)
                continue
            if not batch_or_each(
                result, tenant.pk, chunk, prune, what="prune_checkpoints: thread pk"
            ):
                return
            sweep.tick(len(chunk))


def _prune(threads, thread_pks: list[int], keep: int) -> Counter:
    """Prune those of `threads` among `thread_pks` that nothing runs on,
    locked SKIP LOCKED in the caller's transaction; the counts."""
    locked = list(
        threads.filter(pk__in=thread_pks)
        .exclude(_active_run())
        .select_for_update(skip_locked=True, of=("self",))
        .order_by("pk")
    )
    removed = storage.checkpoints_prune(
        thread_pks=[thread.pk for thread in locked], keep=keep
    )
    counts: Counter = Counter()
    for rows in removed.values():
        counts["threads_pruned"] += 1
        counts.update(rows)
    if skipped := len(thread_pks) - len(locked):
        counts["threads_busy"] += skipped
    return counts


def _plan_prune(result: SweepResult, tenant: Tenant, thread_pks, keep: int) -> None:
    for row in selectors.namespaces_over(thread_pks=thread_pks, keep=keep):
        doomed = row["rows"] - keep
        result.add(tenant.pk, "threads_pruned")
        result.add(tenant.pk, "checkpoints", doomed)
        ns = f" ns {row['checkpoint_ns']!r}" if row["checkpoint_ns"] else ""
        result.plan.append(
            f"prune thread {tenant.slug}/{row['thread__thread_id']}{ns}: "
            f"{doomed} of {row['rows']} checkpoints (keep {keep})"
        )


# --- approvals ---------------------------------------------------------------------


def escalate_approvals(sweep: Sweep) -> SweepResult:
    """Remind, escalate and finally expire unanswered approval requests;
    send the approval e-mails still owed after a grace period."""
    return approvals_escalate(sweep)


def close_orphaned_approvals(sweep: Sweep) -> SweepResult:
    """Close pending approvals whose thread, run or agent version is gone."""
    return approvals_close_orphaned(sweep)


# --- deletion requests ---------------------------------------------------------------


def carry_out_deletions(sweep: Sweep) -> SweepResult:
    """Remove the rows of requested deletions, a batch of threads at a time.

    Requests on hold are looked at too: once their hold is lifted, they go
    ahead (key shredded, then rows removed, in one transaction).
    """
    result = SweepResult()
    open_requests = DeletionRequest.objects.filter(
        status__in=DeletionRequest.OPEN
    ).order_by("created_at", "pk")
    cursor = None
    while not sweep.out_of_time():
        queryset = open_requests.filter(after(cursor, "created_at", "pk"))
        request = queryset.select_related("tenant").first()
        if request is None:
            break
        cursor = (request.created_at, request.pk)
        # A request that fails is left for the next run; the others go on.
        with isolated(
            result, request.tenant_id, f"carry_out_deletions: request {request.pk}"
        ):
            if sweep.dry_run:
                _plan_deletion(result, request)
            else:
                _carry_out(sweep, result, request)
    return result


def _carry_out(sweep: Sweep, result: SweepResult, request: DeletionRequest) -> None:
    """The request's threads a batch at a time, the cursor passing a thread
    that failed (tried again by the next run), so that it holds back none of
    the request's other threads."""
    unheld = services.request_threads(request).filter(legal_hold=False)
    still_open = True

    def carry_out(pks: list[int]) -> Counter | None:
        nonlocal still_open
        step = services.deletion_carry_out(
            request=request, batch_size=max(len(pks), 1), thread_pks=pks
        )
        if step is None:
            return None  # another sweep holds it, or it is no longer open
        still_open = step.request.is_open
        counts: Counter = Counter()
        for rows in step.removed.values():
            counts["threads_removed"] += 1
            counts.update(rows)
        if step.busy:
            counts["threads_busy"] += step.busy
        if step.request.status == DeletionRequest.Status.COMPLETED:
            counts["requests_completed"] += 1
        return counts

    cursor = 0
    what = f"carry_out_deletions: request {request.pk}, thread pk"
    while still_open and not sweep.out_of_time():
        pks = list(
            unheld.filter(pk__gt=cursor)
            .order_by("pk")
            .values_list("pk", flat=True)[: sweep.batch_size]
        )
        # No thread left to take (or only held ones): one step all the same,
        # which completes the request or puts it on hold.
        if not batch_or_each(result, request.tenant_id, pks, carry_out, what=what):
            return
        if not pks:
            return
        cursor = pks[-1]
        sweep.tick(len(pks))


def _plan_deletion(result: SweepResult, request: DeletionRequest) -> None:
    threads = services.request_threads(request)
    tenant_held = services.tenant_on_hold(request.tenant_id)
    rows = list(threads.values_list("thread_id", "legal_hold"))
    held = sum(1 for _, on_hold in rows if on_hold or tenant_held)
    checkpoints = Checkpoint.objects.filter(thread__in=threads).count()
    result.add(request.tenant_id, "threads_removed", len(rows) - held)
    result.add(request.tenant_id, "checkpoints", checkpoints)
    if held:
        result.add(request.tenant_id, "threads_on_hold", held)
    what = request.thread_ref or "a data subject"
    result.plan.append(
        f"carry out deletion request {request.pk} ({request.tenant.slug}, {what}, "
        f"{request.status}): remove {len(rows) - held} thread(s), "
        f"{checkpoints} checkpoints; {held} on legal hold"
    )


# --- runs whose lease expired ------------------------------------------------------


def recover_runs(sweep: Sweep) -> SweepResult:
    """Re-dispatch runs whose lease expired (runs.dispatch.runs_recover_stalled).

    Counted per tenant before dispatching; the worker that claims a run takes
    it over from its last checkpoint and records `run.recovered`.
    """
    now = sweep.now
    result = SweepResult()
    expired = selectors.expired_leases(now=now).values_list(
        "tenant_id", "tenant__slug", "thread__thread_id", "id"
    )[: sweep.batch_size]
    for tenant_id, slug, thread_id, run_id in expired:
        result.add(tenant_id, "expired_leases")
        result.plan.append(
            f"re-dispatch run {run_id} ({slug}/{thread_id}): lease expired"
        )
    if not sweep.dry_run:
        dispatched = dispatch.runs_recover_stalled(batch_size=sweep.batch_size)
        sweep.tick(sum(dispatched.values()))
    return result


# --- the audit trail ------------------------------------------------------------------


def seal_audit(sweep: Sweep) -> SweepResult:
    """Seal new audit events into each tenant's hash chain (audit.sealing)."""
    result = SweepResult()
    if sweep.dry_run:
        for tenant_id, slug, unsealed in audit_selectors.unsealed_counts():
            result.add(tenant_id, "events_sealed", unsealed)
            result.plan.append(f"seal {unsealed} audit event(s) of {slug}")
        return result
    for tenant_id in sealing.pending_tenant_ids():
        with isolated(result, tenant_id, "seal_audit: the tenant"):
            while not sweep.out_of_time():
                sealed = sealing.seal_tenant(tenant_id=tenant_id)
                if sealed:
                    result.add(tenant_id, "blocks_sealed")
                    result.add(tenant_id, "events_sealed", sealed)
                    sweep.tick(sealed)
                if sealed < sealing.MAX_BLOCK_EVENTS:
                    break
    return result


def purge_audit(sweep: Sweep) -> SweepResult:
    """Purge sealed audit events past each tenant's audit retention.

    Whole sealed blocks only, so the chain stays verifiable; the purge
    leaves its own `audit.purged` event. Tenants under legal hold keep all.
    """
    result = SweepResult()
    for tenant in _tenants():
        if sweep.out_of_time():
            break
        with isolated(result, tenant.pk, "purge_audit: the tenant"):
            _purge_tenant(sweep, result, tenant)
    return result


def _purge_tenant(sweep: Sweep, result: SweepResult, tenant: Tenant) -> None:
    before = sweep.now - services.policy_for(tenant).audit_retention
    if sweep.dry_run:
        purgeable = audit_selectors.purgeable_events(tenant=tenant, before=before)
        if purgeable is not None and purgeable[1]:
            cut, old = purgeable
            result.add(tenant.pk, "events_purged", old)
            result.plan.append(
                f"purge {old} audit event(s) of {tenant.slug} through "
                f"#{cut.through_seq} (older than {before:%Y-%m-%d})"
            )
        return
    with transaction.atomic():
        if services.tenant_on_hold(tenant, lock=True):
            return
        purged = purge_before(
            tenant=tenant, before=before, actor=Actor.system("retention")
        )
    if purged.events:
        result.add(tenant.pk, "events_purged", purged.events)
        result.add(tenant.pk, "blocks_purged", purged.blocks)
        sweep.tick(purged.events)


# --- Idempotency-Key records ---------------------------------------------------------


def purge_idempotency_records(sweep: Sweep) -> SweepResult:
    """Delete Idempotency-Key records past GATEHOUSE_IDEMPOTENCY_TTL.

    A record keeps a write's first response for its retries
    (runs.api.idempotency); past the TTL a repeat of its key is new work
    anyway, so the record and the response sealed in it serve nothing. Each
    batch one transaction, its rows locked SKIP LOCKED (a request reusing
    the key deletes its own expired record, runs.api.idempotency._reserve).
    Legal holds do not keep them: a record is a replay cache, not a record of
    what happened (the audit trail and the thread's own rows are).
    """
    result = SweepResult()
    expired = IdempotencyRecord.objects.filter(IdempotencyRecord.expired(sweep.now))
    if sweep.dry_run:
        for tenant_id, slug, rows in (
            expired.values("tenant_id")
            .annotate(rows=Count("pk"))
            .values_list("tenant_id", "tenant__slug", "rows")
            .order_by("tenant_id")
        ):
            result.add(tenant_id, "idempotency_records", rows)
            result.plan.append(
                f"delete {rows} Idempotency-Key record(s) of {slug} older than "
                f"{settings.GATEHOUSE_IDEMPOTENCY_TTL}"
            )
        return result
    while not sweep.out_of_time():
        with transaction.atomic():
            doomed = list(
                expired.select_for_update(skip_locked=True)
                .order_by("created_at", "pk")
                .values_list("pk", "tenant_id")[
                    : sweep.batch_size * RECORDS_PER_BATCH_ITEM
                ]
            )
            if not doomed:
                return result
            IdempotencyRecord.objects.filter(pk__in=[pk for pk, _ in doomed]).delete()
        for _, tenant_id in doomed:
            result.add(tenant_id, "idempotency_records")
        sweep.tick(len(doomed))
    return result


# --- the registry and the runner ----------------------------------------------------


@dataclass(frozen=True)
class Job:
    name: str
    function: Callable[[Sweep], SweepResult]
    # The Celery task beat runs for it (retention/migrations/0003_beat_schedule,
    # 0004_beat_idempotency_purge).
    task: str
    summary: str
    unit: str  # what progress counts


JOBS: dict[str, Job] = {
    job.name: job
    for job in (
        Job(
            "recover_runs",
            recover_runs,
            "runs.recover_stalled_runs",
            "re-dispatch runs whose lease expired",
            "runs",
        ),
        Job(
            "escalate_approvals",
            escalate_approvals,
            "retention.escalate_approvals",
            "remind, escalate and expire unanswered approvals; send owed e-mails",
            "approvals",
        ),
        Job(
            "close_orphaned_approvals",
            close_orphaned_approvals,
            "retention.close_orphaned_approvals",
            "close approvals whose thread, run or version is gone",
            "approvals",
        ),
        Job(
            "carry_out_deletions",
            carry_out_deletions,
            "retention.carry_out_deletions",
            "remove the rows of requested deletions",
            "threads",
        ),
        Job(
            "expire_threads",
            expire_threads,
            "retention.expire_threads",
            "delete threads idle past their TTL",
            "threads",
        ),
        Job(
            "prune_checkpoints",
            prune_checkpoints,
            "retention.prune_checkpoints",
            "prune checkpoints to the latest N per thread",
            "threads",
        ),
        Job(
            "seal_audit",
            seal_audit,
            "audit.seal",
            "seal new audit events into hash-chained blocks",
            "events",
        ),
        Job(
            "purge_audit",
            purge_audit,
            "retention.purge_audit",
            "purge audit events past their retention",
            "events",
        ),
        Job(
            "purge_idempotency_records",
            purge_idempotency_records,
            "retention.purge_idempotency_records",
            "delete Idempotency-Key records past GATEHOUSE_IDEMPOTENCY_TTL",
            "records",
        ),
    )
}


@dataclass
class JobReport:
    job: str
    dry_run: bool
    counts: dict[int, Counter]
    plan: list[str] = field(default_factory=list)
    seconds: float = 0.0
    stopped_early: bool = False

    @property
    def totals(self) -> Counter:
        totals: Counter = Counter()
        for counts in self.counts.values():
            totals.update(counts)
        return totals

    def outcome(self) -> str:
        return describe_counts(self.totals)


def describe_counts(counts: Counter | dict) -> str:
    parts = [
        f"{rows} {name.replace('_', ' ')}" for name, rows in sorted(counts.items())
    ]
    return ", ".join(parts) if parts else "nothing to do"


def job_run(
    name: str,
    *,
    dry_run: bool = False,
    batch_size: int | None = None,
    time_budget: float | None = None,
    progress: Progress | None = None,
    now: datetime | None = None,
) -> JobReport:
    """Run one job once; record one audit event per tenant it changed."""
    try:
        job = JOBS[name]
    except KeyError:
        raise ValueError(
            f"no retention job {name!r}; jobs: {', '.join(JOBS)}"
        ) from None
    started = time.monotonic()
    deadline = started + time_budget if time_budget else None
    result = job.function(
        Sweep(
            now=now or timezone.now(),
            batch_size=batch_size or settings.GATEHOUSE_RETENTION_BATCH_SIZE,
            dry_run=dry_run,
            deadline=deadline,
            progress=progress,
        )
    )
    report = JobReport(
        job=name,
        dry_run=dry_run,
        counts={pk: counts for pk, counts in result.counts.items() if counts},
        plan=result.plan,
        seconds=time.monotonic() - started,
        stopped_early=out_of_time(deadline),
    )
    if not dry_run:
        _record(report)
    logger.info(
        "retention job %s%s: %s in %.1fs",
        name,
        " (dry run)" if dry_run else "",
        report.outcome(),
        report.seconds,
    )
    return report


def _record(report: JobReport) -> None:
    tenants = Tenant.objects.in_bulk(list(report.counts))
    for tenant_id, counts in sorted(report.counts.items()):
        tenant = tenants.get(tenant_id)
        if tenant is None:
            continue
        with transaction.atomic():
            record(
                tenant=tenant,
                kind=events.RETENTION_JOB_RAN,
                actor=Actor.system("retention"),
                data={
                    "job": report.job,
                    "outcome": describe_counts(counts)[:200],
                    "stopped_early": report.stopped_early,
                    **{name[:64]: int(rows) for name, rows in counts.items()},
                },
            )
