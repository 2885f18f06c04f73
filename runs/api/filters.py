"""Query-string filters of the runs API's lists, as django-filter FilterSets
(DRF's DjangoFilterBackend applies them; drf-spectacular documents them).

A bad value answers 400 naming the parameter, like any invalid field.
"""

from __future__ import annotations

import django_filters
from django.db import models

from runs.models import Thread


def choice_filter(choices: type[models.TextChoices], **kwargs) -> django_filters.Filter:
    """An exact match on one of `choices`; any other value is refused, with the
    values that are allowed."""
    allowed = ", ".join(choices.values)
    return django_filters.ChoiceFilter(
        choices=choices.choices,
        error_messages={"invalid_choice": f"must be one of {allowed}"},
        **kwargs,
    )


class ThreadFilter(django_filters.FilterSet):
    status = choice_filter(Thread.Status)
    agent = django_filters.CharFilter(field_name="agent_name", max_length=100)

    class Meta:
        model = Thread
        fields = ["status", "agent"]
