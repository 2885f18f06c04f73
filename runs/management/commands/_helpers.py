from django.core.management.base import CommandError

from runs.models import Tenant


def tenant_by_slug(slug: str) -> Tenant:
    try:
        return Tenant.objects.get(slug=slug)
    except Tenant.DoesNotExist:
        raise CommandError(
            f"no tenant {slug!r}; create it with create_tenant"
        ) from None
