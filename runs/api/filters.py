"""Query-string filters of the runs API's lists, as django-filter FilterSets
(DRF's DjangoFilterBackend applies them; drf-spectacular documents them).

A bad value answers 400 naming the parameter, like any invalid field.
"""

from __future__ import annotations

import copy

import django_filters
from django.db import models
from django.http import QueryDict

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


class _SharedFields(dict):
    """A form class's fields that its forms share rather than copy (Django's
    form deep-copies its class's fields, choices and all, per instance): the
    form fields of plain filters keep nothing of what they clean, and a
    FilterSet's form is only bound and cleaned, never rendered nor changed."""

    def __deepcopy__(self, memo):
        return self


class SharedFilterSet(django_filters.FilterSet):
    """A FilterSet whose filters and form class are built once per process.

    django-filter deep-copies every filter and builds a new form class on each
    request, so that a filter may keep the request's FilterSet (`parent`, for a
    `method=` filter or a queryset taken from the request): on a list of a few
    plain filters that was most of the cost of filtering (0.4 ms of CPU). The
    filters here are stateless (a field name, a lookup, a form field), so one
    set serves every request and thread; a filter that needs its parent is
    refused when the set is first built. The form is one per request; its
    fields are the form class's (_SharedFields).
    """

    def __init__(self, data=None, queryset=None, *, request=None, prefix=None):
        # FilterSet.__init__ (django-filter 26.2) without its deep copy.
        if queryset is None:
            queryset = self._meta.model._default_manager.all()
        self.is_bound = data is not None
        self.data = data or QueryDict()
        self.queryset = queryset
        self.request = request
        self.form_prefix = prefix
        self.filters, self._form_class = self._shared(queryset.model)

    @classmethod
    def _shared(cls, model):
        shared = cls.__dict__.get("_shared_by_model")
        if shared is None:
            shared = {}
            cls._shared_by_model = shared
        built = shared.get(model)
        if built is None:
            # Two threads may both build it: the same result, one is kept.
            filters = {}
            for name, base in cls.base_filters.items():
                if base.method is not None or hasattr(base, "get_request"):
                    raise TypeError(
                        f"{cls.__name__}.{name} needs its FilterSet: "
                        "use django_filters.FilterSet"
                    )
                filters[name] = filter_ = copy.deepcopy(base)
                filter_.model = model
            form_class = type(
                f"{cls.__name__}Form",
                (cls._meta.form,),
                {name: filter_.field for name, filter_ in filters.items()},
            )
            form_class.base_fields = _SharedFields(form_class.base_fields)
            built = shared[model] = (filters, form_class)
        return built

    def get_form_class(self):
        return self._form_class


class ThreadFilter(SharedFilterSet):
    status = choice_filter(Thread.Status)
    agent = django_filters.CharFilter(field_name="agent_name", max_length=100)

    class Meta:
        model = Thread
        fields = ["status", "agent"]
