"""Reads of the audit trail: filtered event lists, local days, thread timelines,
and what sealing and the retention purge would do (for dry runs)."""

from __future__ import annotations

import calendar
import datetime
import re
import zoneinfo
from dataclasses import dataclass, field

from django.db.models import F, OuterRef, QuerySet, Subquery
from django.db.models.fields.json import KT
from django.db.models.functions import Coalesce

from audit import events, sealing
from audit.models import (
    ActorType,
    AuditBlock,
    AuditChainHead,
    AuditEvent,
    AuditSequence,
    AuditVerification,
)
from runs.models import Tenant

UTC = datetime.UTC
# A timeline is a summary for a person; a thread with more entries than this
# (after merging repeats) is cut, and the full list is in the events API.
MAX_TIMELINE_ENTRIES = 1000
EVENT_ORDER = ("occurred_at", "seq")


def zone(name: str) -> zoneinfo.ZoneInfo:
    """An IANA zone by name, or ValueError naming what was wrong."""
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        raise ValueError(
            f"{name!r} is not a known IANA time zone (for example Europe/Paris)"
        ) from None


# Days whose bounds exist in every zone (UTC-12 to UTC+14) as Python instants.
FIRST_DAY, LAST_DAY = datetime.date(1, 1, 2), datetime.date(9999, 12, 30)
DAY_SHAPE = re.compile(r"(\d{4})-(\d{2})-(\d{2})")


def parse_day(text: str) -> datetime.date:
    """A YYYY-MM-DD day, or ValueError saying what is wrong with it: a day
    that does not exist (2026-02-30) is named as such, not as a bad format."""
    shape = DAY_SHAPE.fullmatch(text.strip())
    if shape is None:
        raise ValueError(f"{text!r} is not a date: use YYYY-MM-DD, e.g. 2026-03-01")
    year, month, day = (int(part) for part in shape.groups())
    if not 1 <= month <= 12:
        raise ValueError(f"{text} does not exist: there is no month {month}")
    if year < 1:
        raise ValueError(f"{text} does not exist: there is no year 0")
    length = calendar.monthrange(year, month)[1]
    if not 1 <= day <= length:
        name = datetime.date(year, month, 1).strftime("%B %Y")
        raise ValueError(f"{text} does not exist: {name} has {length} days")
    parsed = datetime.date(year, month, day)
    if not FIRST_DAY <= parsed <= LAST_DAY:
        raise ValueError(f"{text}: must be a day from {FIRST_DAY} to {LAST_DAY}")
    return parsed


def day_bounds(
    day: datetime.date, tz: datetime.tzinfo = UTC
) -> tuple[datetime.datetime, datetime.datetime]:
    """The instants [start, end) of one local calendar day, in UTC.

    A day is 23 or 25 hours long across a DST change; both ends are local
    midnights. Where midnight itself is skipped (a zone that springs forward
    at 00:00), fold=0 places it at the instant of the change, which is when
    that local day begins.
    """
    if not FIRST_DAY <= day <= LAST_DAY:
        raise ValueError(f"must be a day from {FIRST_DAY} to {LAST_DAY}")
    start = datetime.datetime.combine(day, datetime.time.min, tzinfo=tz)
    end = datetime.datetime.combine(
        day + datetime.timedelta(days=1), datetime.time.min, tzinfo=tz
    )
    return start.astimezone(UTC), end.astimezone(UTC)


def event_list(
    *, tenant: Tenant, day: datetime.date | None = None, tz: datetime.tzinfo = UTC
) -> QuerySet[AuditEvent]:
    """A tenant's events, oldest first; one local day's (in `tz`) if given.
    The API's filters are audit.api.filters.AuditEventFilter.

    Ordered by (occurred_at, seq), which is the order of the sequence
    numbers: record() never stamps an event earlier than the one before it.
    Ordering by time lets Postgres read a time range from the
    (tenant, occurred_at, seq) index in order and stop after a page; ordered
    by seq alone, it may walk the tenant's whole sequence index instead, not
    knowing that the range sits at one place in it.
    """
    queryset = AuditEvent.objects.for_tenant(tenant)
    if day is not None:
        start, end = day_bounds(day, tz)
        queryset = queryset.filter(occurred_at__gte=start, occurred_at__lt=end)
    return queryset.order_by(*EVENT_ORDER)


def parse_actor(value: str) -> tuple[str, str | None]:
    """`type` or `type:id` (for example `api_key:12`, `agent:refund`)."""
    actor_type, sep, actor_id = value.partition(":")
    if actor_type not in ActorType.values:
        raise ValueError(
            f"actor must be a type ({', '.join(ActorType.values)}) or type:id, "
            f"not {value!r}"
        )
    return actor_type, (actor_id if sep else None)


# --- Thread timelines ---------------------------------------------------------


@dataclass
class TimelineEntry:
    at: datetime.datetime
    seq: int
    last_seq: int
    kind: str
    action: str
    actor: str
    text: str
    count: int = 1
    # What the entry links to: the run it happened in, the approval request
    # it is about (data["approval_id"]); "" when none.
    run_id: str = ""
    approval_id: str = ""


@dataclass
class Timeline:
    thread_id: str
    events: int = 0
    hidden: int = 0
    deleted: bool = False
    truncated: bool = False
    first_at: datetime.datetime | None = None
    last_at: datetime.datetime | None = None
    entries: list[TimelineEntry] = field(default_factory=list)

    def story(self, tz: datetime.tzinfo = UTC) -> list[str]:
        """The timeline as lines a person reads top to bottom."""
        lines = []
        for entry in self.entries:
            when = entry.at.astimezone(tz).strftime("%Y-%m-%d %H:%M")
            times = f" (x{entry.count})" if entry.count > 1 else ""
            lines.append(f"{when} {entry.text}{times}")
        return lines


_PEOPLE_AND_KEYS = {ActorType.USER, ActorType.API_KEY}


def _entry_text(summary: str, actor_type: str, actor_label: str) -> str:
    # Who acted matters when a person or a key did it ("approved, by rita");
    # the agent and the system are implied by the story.
    if actor_type in _PEOPLE_AND_KEYS and actor_label and actor_label not in summary:
        return f"{summary}, by {actor_label}"
    return summary


_ENDINGS = (".succeeded", ".failed")


def _completes(entry: TimelineEntry, kind: str, action: str) -> bool:
    """Whether `kind` ends what `entry` started (x.started, then x.succeeded)."""
    noun, _, verb = entry.kind.rpartition(".")
    return (
        verb == "started"
        and kind in {noun + ending for ending in _ENDINGS}
        and entry.action == action
    )


def thread_timeline(*, tenant: Tenant, thread_id: str) -> Timeline | None:
    """The compact story of one thread, or None when it left no events.

    Consecutive repeats (same kind, summary and actor) fold into one entry
    with a count; an `x.started` directly followed by its `x.succeeded` or
    `x.failed` (same action) becomes one entry; kinds declared with
    timeline=False are only counted.
    """
    rows = (
        AuditEvent.objects.for_tenant(tenant)
        .filter(thread_id=thread_id)
        .order_by("seq")
        .annotate(approval=KT("data__approval_id"))
        .values_list(
            "seq",
            "occurred_at",
            "kind",
            "action",
            "actor_type",
            "actor_label",
            "summary",
            "run_id",
            "approval",
        )
    )
    timeline = Timeline(thread_id=thread_id)
    for (
        seq,
        occurred_at,
        kind,
        action,
        actor_type,
        actor_label,
        summary,
        run_id,
        approval_id,
    ) in rows.iterator(chunk_size=1000):
        timeline.events += 1
        timeline.first_at = timeline.first_at or occurred_at
        timeline.last_at = occurred_at
        if kind == events.THREAD_DELETED.name:
            timeline.deleted = True
        declared = events.REGISTRY.get(kind)
        if declared is not None and not declared.timeline:
            timeline.hidden += 1
            continue
        text = _entry_text(summary, actor_type, actor_label)
        last = timeline.entries[-1] if timeline.entries else None
        if last is not None and (last.kind, last.text) == (kind, text):
            last.count += 1
            last.last_seq = seq
            continue
        if last is not None and last.count == 1 and _completes(last, kind, action):
            # "refund_order called" then "refund_order succeeded": one line,
            # at the time it started, saying how it ended.
            last.kind, last.text, last.last_seq = kind, text, seq
            last.run_id = last.run_id or run_id or ""
            continue
        if len(timeline.entries) >= MAX_TIMELINE_ENTRIES:
            timeline.truncated = True
            continue
        timeline.entries.append(
            TimelineEntry(
                at=occurred_at,
                seq=seq,
                last_seq=seq,
                kind=kind,
                action=action,
                actor=actor_label,
                text=text,
                run_id=run_id or "",
                approval_id=approval_id or "",
            )
        )
    return timeline if timeline.events else None


def latest_verification(*, tenant: Tenant) -> AuditVerification | None:
    return AuditVerification.objects.for_tenant(tenant).order_by("-checked_at").first()


def unsealed_counts() -> list[tuple[int, str, int]]:
    """(tenant id, slug, events committed and not sealed yet) of each tenant
    that has some: what the next sealing would cover."""
    sealed = AuditChainHead.objects.filter(tenant_id=OuterRef("tenant_id")).values(
        "last_seq"
    )
    rows = (
        AuditSequence.objects.annotate(
            unsealed=F("last_seq") - Coalesce(Subquery(sealed), 0)
        )
        .filter(unsealed__gt=0)
        .order_by("tenant_id")
    )
    return list(rows.values_list("tenant_id", "tenant__slug", "unsealed"))


@dataclass(frozen=True)
class PurgeCut:
    """A purge removes the tenant's events and blocks through `through_seq`;
    `anchor_hash` is the hash of the last block removed, to which the first
    remaining block chains."""

    through_seq: int
    anchor_hash: str


def purge_cut(*, tenant: Tenant, before: datetime.datetime) -> PurgeCut | None:
    """How far a purge of the events older than `before` may go, or None.

    Whole sealed blocks only, so that the chain stays verifiable: the last
    block that ends before the first event at or after `before` (time order
    is sequence order), if it is beyond what earlier purges removed.
    """
    first_recent = (
        AuditEvent.objects.for_tenant(tenant)
        .filter(occurred_at__gte=before)
        .order_by(*EVENT_ORDER)
        .values_list("seq", flat=True)
        .first()
    )
    candidates = AuditBlock.objects.for_tenant(tenant)
    if first_recent is not None:
        candidates = candidates.filter(last_seq__lt=first_recent)
    last_block = (
        candidates.order_by("-last_seq").values_list("last_seq", "block_hash").first()
    )
    start, _ = sealing.chain_start(tenant.pk)
    if last_block is None or last_block[0] < start:
        return None
    return PurgeCut(*last_block)


def purgeable_events(
    *, tenant: Tenant, before: datetime.datetime
) -> tuple[PurgeCut, int] | None:
    """The cut a purge would make now and the number of events it would remove
    (a dry run's figures), or None."""
    cut = purge_cut(tenant=tenant, before=before)
    if cut is None:
        return None
    return cut, AuditEvent.objects.for_tenant(tenant).filter(
        seq__lte=cut.through_seq
    ).count()
