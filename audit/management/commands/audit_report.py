"""A readable report of one local day of a tenant's audit trail."""

from __future__ import annotations

import datetime

from django.core.management.base import BaseCommand, CommandError
from django.db.models import Count

from audit import events, selectors
from audit.models import ActorType
from runs.models import Tenant

LISTED_THREADS = 50


class Command(BaseCommand):
    help = "Print what happened in a tenant on one local day, for a person to read."

    def add_arguments(self, parser):
        parser.add_argument("--tenant", required=True, help="the tenant's slug")
        parser.add_argument("--date", required=True, help="the day, YYYY-MM-DD")
        parser.add_argument(
            "--tz", default="UTC", help="IANA time zone of the day (default UTC)"
        )

    def handle(self, *args, tenant: str, date: str, tz: str, **options):
        found = Tenant.objects.filter(slug=tenant).first()
        if found is None:
            raise CommandError(f"There is no tenant {tenant!r}.")
        try:
            day = selectors.parse_day(date)
        except ValueError as exc:
            raise CommandError(f"--date: {exc}.") from None
        try:
            zone = selectors.zone(tz)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        self.report(found, day, zone)

    def line(self, text: str = "") -> None:
        self.stdout.write(text)

    def report(self, tenant: Tenant, day: datetime.date, zone) -> None:
        start, end = selectors.day_bounds(day, zone)
        day_events = selectors.event_list(tenant=tenant, day=day, tz=zone)
        total = day_events.count()
        hours = (end - start).total_seconds() / 3600
        self.line(f"Audit report for {tenant.name} ({tenant.slug})")
        self.line(
            f"{day:%A %d %B %Y} in {zone.key}: {hours:g} hours, "
            f"{start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} UTC"
        )
        self.line("")
        if not total:
            self.line("Nothing was recorded that day.")
            return
        bounds = day_events.order_by().values_list("seq", flat=True)
        self.line(
            f"{total} event(s), #{bounds.order_by('seq').first()} to "
            f"#{bounds.order_by('-seq').first()}."
        )

        self.line("")
        self.line("What happened")
        by_kind = (
            day_events.order_by().values("kind").annotate(n=Count("pk")).order_by("-n")
        )
        for row in by_kind:
            declared = events.REGISTRY.get(row["kind"])
            note = "" if declared else " (kind no longer declared)"
            self.line(f"  {row['n']:>7}  {row['kind']}{note}")

        self.line("")
        self.line("Who acted")
        by_actor = (
            day_events.order_by()
            .values("actor_type", "actor_label")
            .annotate(n=Count("pk"))
            .order_by("-n", "actor_label")
        )
        for row in by_actor:
            label = row["actor_label"] or row["actor_type"]
            self.line(f"  {row['n']:>7}  {label} ({row['actor_type']})")

        threads = (
            day_events.exclude(thread_id="")
            .order_by()
            .values("thread_id")
            .annotate(n=Count("pk"))
            .order_by("-n", "thread_id")
        )
        thread_count = threads.count()
        if thread_count:
            self.line("")
            self.line(f"Threads ({thread_count})")
            for row in threads[:LISTED_THREADS]:
                self.line(f"  {row['n']:>7}  {row['thread_id']}")
            if thread_count > LISTED_THREADS:
                self.line(f"  ... and {thread_count - LISTED_THREADS} more")

        decisions = day_events.filter(
            actor_type__in=[ActorType.USER, ActorType.API_KEY]
        )
        deletions = day_events.filter(kind=events.THREAD_DELETED.name)
        for title, subset in (
            ("Done by people and API keys", decisions),
            ("Deletions", deletions),
        ):
            if subset.exists():
                self.line("")
                self.line(title)
                self.timeline(subset, zone)

        self.line("")
        self.line(f"Every event, in order (times in {zone.key})")
        self.timeline(day_events, zone)

    def timeline(self, queryset, zone) -> None:
        rows = queryset.values_list(
            "seq", "occurred_at", "actor_label", "thread_id", "summary"
        ).iterator(chunk_size=2000)
        for seq, occurred_at, actor, thread_id, summary in rows:
            when = occurred_at.astimezone(zone).strftime("%H:%M:%S")
            thread = f" [{thread_id}]" if thread_id else ""
            self.line(f"  {when}  #{seq:<6} {summary}{thread} ({actor})")
