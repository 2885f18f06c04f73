"""The admin site: Django's, with one rule for every model's list page.

A list's query string is client input: `?tenant=abc`, a year beyond 9999 or a
NUL character would otherwise fail inside a filter or the database and answer
500. Any such failure while the list is built is an invalid lookup, which
Django's admin answers by redirecting to the unfiltered list with `?e=1`.
"""

from django.contrib import admin
from django.contrib.admin.apps import AdminConfig
from django.contrib.admin.options import IncorrectLookupParameters
from django.core.exceptions import ValidationError
from django.db import DataError, transaction


class ValidatedLookupsMixin:
    def get_changelist_instance(self, request):
        try:
            # A savepoint: a refused query must not abort the transaction
            # the request may be running in.
            with transaction.atomic():
                return super().get_changelist_instance(request)
        except (
            ValueError,
            TypeError,
            OverflowError,
            ValidationError,
            DataError,
        ) as exc:
            raise IncorrectLookupParameters(exc) from exc


class GatehouseAdminSite(admin.AdminSite):
    def register(self, model_or_iterable, admin_class=None, **options):
        admin_class = admin_class or admin.ModelAdmin
        if not issubclass(admin_class, ValidatedLookupsMixin):
            admin_class = type(
                admin_class.__name__, (ValidatedLookupsMixin, admin_class), {}
            )
        super().register(model_or_iterable, admin_class, **options)


class GatehouseAdminConfig(AdminConfig):
    default_site = "config.admin.GatehouseAdminSite"
