"""Batch sweeps: what one run of a sweep is given (`Sweep`), what it
reports (`SweepResult`), and how one failing step is kept from stopping the
rest (`isolated`).

The scheduled jobs of retention (retention.jobs) and the sweeps of other apps
(approvals.sweeps) share these, so that no app imports another's sweep to
learn their shape.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime

from django.db.models import Q

from runs.outages import is_database_outage

logger = logging.getLogger(__name__)

# The counter of a result's steps that failed and were skipped until the
# sweep's next run.
ERRORS = "errors"

Progress = Callable[[int], None]


def out_of_time(deadline: float | None) -> bool:
    """Whether a `time.monotonic()` deadline has passed (None: never)."""
    return deadline is not None and time.monotonic() > deadline


@dataclass(frozen=True)
class Sweep:
    """One run of a sweep: the time it takes as now, its batch size, whether
    it only plans (a dry run), when it must stop, and whom to tell of progress."""

    now: datetime
    batch_size: int
    dry_run: bool = False
    deadline: float | None = None
    progress: Progress | None = None

    def out_of_time(self) -> bool:
        return out_of_time(self.deadline)

    def tick(self, count: int) -> None:
        if self.progress is not None and count:
            self.progress(count)


@dataclass
class SweepResult:
    """Counts per tenant id, and what a dry run would have done."""

    counts: dict[int, Counter] = field(default_factory=lambda: defaultdict(Counter))
    plan: list[str] = field(default_factory=list)

    def add(self, tenant_id: int, name: str, amount: int = 1) -> None:
        self.counts[tenant_id][name] += amount

    def merge(self, tenant_id: int, counts: Counter) -> None:
        self.counts[tenant_id].update(counts)


def log_failure(what: str, error: BaseException, *, tenant_id: int) -> None:
    """Log a failed step by `what` (ids, never content) and the error's class
    and SQLSTATE: not its message, which may quote a row's data."""
    sqlstate = next(
        (
            link.sqlstate
            for link in (error, error.__cause__)
            if getattr(link, "sqlstate", None)
        ),
        None,
    )
    logger.error(
        "sweep step failed, skipped until the next run: tenant %s, %s: %s%s",
        tenant_id,
        what,
        type(error).__name__,
        f" (SQLSTATE {sqlstate})" if sqlstate else "",
    )


@contextmanager
def isolated(result: SweepResult, tenant_id: int, what: str) -> Iterator[None]:
    """One step of a sweep (a thread, a request, a tenant) that must not stop
    the others: a failure other than a database outage is logged
    (`log_failure`), counted as one of the tenant's `errors`, and swallowed, so
    the sweep goes on; the step's transaction, opened inside, rolls back, and
    the next run tries it again."""
    try:
        yield
    except Exception as error:
        if is_database_outage(error):
            raise  # not the step's fault: the job fails, to be run again whole
        result.add(tenant_id, ERRORS)
        log_failure(what, error, tenant_id=tenant_id)


def after(cursor: tuple | None, *fields: str) -> Q:
    """Rows after `cursor` (the values of `fields` of the last row handled)
    in the order of `fields`: keyset pagination over a unique ordering."""
    if cursor is None:
        return Q()
    first, last = fields
    return Q(**{f"{first}__gt": cursor[0]}) | Q(
        **{first: cursor[0], f"{last}__gt": cursor[1]}
    )


def batch_or_each(
    result: SweepResult,
    tenant_id: int,
    pks: list[int],
    work: Callable[[list[int]], Counter | None],
    *,
    what: str,
) -> bool:
    """Do `work` on a batch of rows, `pks`; if the batch fails, on each row
    alone, so that one row that fails holds back none of the others.

    `work(pks)` opens its own transaction and returns the counts to add, or
    None to stop (a tenant hold placed since the run started, or a deletion
    request another sweep holds or that is no longer open). A database
    outage propagates; a row that fails alone is counted and logged
    (`isolated`, as "<what> <pk>") and skipped until the next run. False if
    `work` stopped.
    """
    try:
        counts = work(pks)
    except Exception as error:
        if is_database_outage(error) or not pks:
            raise  # an outage fails the job; no rows: the caller's step failed
        logger.warning(
            "sweep batch failed (%s): tenant %s, %s %s..%s; one at a time",
            type(error).__name__,
            tenant_id,
            what,
            pks[0],
            pks[-1],
        )
        for pk in pks:
            with isolated(result, tenant_id, f"{what} {pk}"):
                counts = work([pk])
                if counts is None:
                    return False
                result.merge(tenant_id, counts)
        return True
    if counts is None:
        return False
    result.merge(tenant_id, counts)
    return True
