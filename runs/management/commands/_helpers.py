from django.core.management.base import BaseCommand, CommandError
from tqdm import tqdm

from runs.models import Tenant


def tenant_by_slug(slug: str) -> Tenant:
    try:
        return Tenant.objects.get(slug=slug)
    except Tenant.DoesNotExist:
        raise CommandError(
            f"no tenant {slug!r}; create it with create_tenant"
        ) from None


def progress_bar(
    command: BaseCommand,
    *,
    verbosity: int,
    unit: str,
    desc: str,
    total: int | None = None,
) -> tqdm:
    """A progress bar that redraws one line of the command's stderr.

    tqdm is given the raw stream under Django's OutputWrapper: the wrapper ends
    every write with a newline, which turns each redraw into a line of its own.
    Silent with --verbosity 0.
    """
    return tqdm(
        total=total,
        unit=f" {unit}",  # "3 threads", not "3threads"
        desc=desc,
        file=command.stderr._out,
        disable=verbosity == 0,
        dynamic_ncols=True,
    )
