"""Query-string filters of GET /api/v1/audit/events, as a django-filter
FilterSet (see runs.api.filters): DRF's DjangoFilterBackend applies it and
drf-spectacular documents it. A bad value answers 400 naming the parameter.
"""

from __future__ import annotations

import datetime

import django_filters
from django import forms
from drf_spectacular.utils import extend_schema_field

from audit import selectors
from audit.models import AuditEvent


def _parsed(parse, what: str):
    """A form field that reads its text with `parse` (a selectors function
    that raises ValueError saying what is wrong), no longer than
    `max_length`."""

    class ParsedField(forms.Field):
        def __init__(self, *, max_length: int = 64, **kwargs) -> None:
            self.max_length = max_length
            super().__init__(**kwargs)

        def to_python(self, value):
            if value in self.empty_values:
                return None
            text = str(value).strip()
            if len(text) > self.max_length:
                raise forms.ValidationError(
                    f"Ensure this value has at most {self.max_length} characters "
                    f"(it has {len(text)})."
                )
            try:
                return parse(text)
            except ValueError as exc:
                # As a parameter, never the message itself: django-filter
                # %-formats messages, and the reason quotes the client's text
                # (?tz=% was a 500).
                raise forms.ValidationError(
                    "%(reason)s", params={"reason": str(exc)}
                ) from None

    ParsedField.__name__ = f"{what.title()}Field"
    return ParsedField


class DayFilter(django_filters.Filter):
    """A YYYY-MM-DD day; one that does not exist (2026-02-30) is named as such."""

    field_class = _parsed(selectors.parse_day, "day")


class ZoneFilter(django_filters.Filter):
    field_class = _parsed(selectors.zone, "zone")


class ActorFilter(django_filters.Filter):
    field_class = _parsed(selectors.parse_actor, "actor")


class InstantField(django_filters.fields.IsoDateTimeField):
    """An ISO 8601 instant that exists in UTC too: 0001-01-01T00:00+14:00 is
    before the first instant Python (and Postgres) can hold."""

    def to_python(self, value):
        instant = super().to_python(value)
        if instant is None:
            return None
        try:
            return instant.astimezone(selectors.UTC)
        except OverflowError:
            raise forms.ValidationError("Datetime value out of range.") from None


class InstantFilter(django_filters.IsoDateTimeFilter):
    field_class = InstantField


class AuditEventFilterForm(forms.Form):
    def clean(self):
        cleaned = super().clean()
        if cleaned.get("tz") is not None and cleaned.get("date") is None:
            self.add_error("tz", "tz applies to date; give both.")
        since, until = cleaned.get("since"), cleaned.get("until")
        if since and until and until <= since:
            self.add_error("until", "must be later than since.")
        return cleaned


DAY_HELP = "One local day, YYYY-MM-DD, in `tz`."
ZONE_HELP = "IANA time zone of `date` (default UTC), e.g. Europe/Paris."
ACTOR_HELP = "An actor type (user, api_key, agent, system) or type:id."


class AuditEventFilter(django_filters.FilterSet):
    since = InstantFilter(
        field_name="occurred_at",
        lookup_expr="gte",
        help_text="Events at or after this instant (ISO 8601).",
    )
    until = InstantFilter(
        field_name="occurred_at",
        lookup_expr="lt",
        help_text="Events before this instant (ISO 8601).",
    )
    date = DayFilter(
        method="filter_day",
        max_length=10,
        help_text=DAY_HELP,
    )
    tz = ZoneFilter(
        method="filter_zone",
        max_length=64,
        help_text=ZONE_HELP,
    )
    thread_id = django_filters.CharFilter(max_length=255)
    kind = django_filters.CharFilter(
        max_length=64, help_text="An event kind, e.g. run.started."
    )
    action = django_filters.CharFilter(max_length=100)
    actor = ActorFilter(
        method="filter_actor",
        max_length=140,
        help_text=ACTOR_HELP,
    )

    class Meta:
        model = AuditEvent
        form = AuditEventFilterForm
        fields = ["since", "until", "date", "tz", "thread_id", "kind", "action"]

    # A method's schema override replaces what drf-spectacular would read from
    # the filter (help_text included), so the description is given here.
    @extend_schema_field(
        {"type": "string", "format": "date", "description": DAY_HELP}
    )
    def filter_day(self, queryset, name, day: datetime.date):
        """One local day: 23 or 25 hours across a DST change."""
        tz = self.form.cleaned_data.get("tz") or selectors.UTC
        start, end = selectors.day_bounds(day, tz)
        return queryset.filter(occurred_at__gte=start, occurred_at__lt=end)

    @extend_schema_field({"type": "string", "description": ZONE_HELP})
    def filter_zone(self, queryset, name, tz):
        return queryset  # the zone of `date` (filter_day reads it)

    @extend_schema_field({"type": "string", "description": ACTOR_HELP})
    def filter_actor(self, queryset, name, actor: tuple[str, str | None]):
        actor_type, actor_id = actor
        queryset = queryset.filter(actor_type=actor_type)
        return queryset if actor_id is None else queryset.filter(actor_id=actor_id)
