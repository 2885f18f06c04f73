"""Batch sweeps: what one run of a sweep is given (`Sweep`) and what it
reports (`SweepResult`).

The scheduled jobs of retention (retention.jobs) and the sweeps of other apps
(approvals.sweeps) share these, so that no app imports another's sweep to
learn their shape.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from django.db.models import Q

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


def after(cursor: tuple | None, *fields: str) -> Q:
    """Rows after `cursor` (the values of `fields` of the last row handled)
    in the order of `fields`: keyset pagination over a unique ordering."""
    if cursor is None:
        return Q()
    first, last = fields
    return Q(**{f"{first}__gt": cursor[0]}) | Q(
        **{first: cursor[0], f"{last}__gt": cursor[1]}
    )
