"""Which agent versions threads are pinned to, and which threads cannot continue.

Run it before and after a deploy: it lists every registered version with its
live threads by status and the patches it knows, then every group of threads
that no registered code can continue (their version is gone, or they took a
patch the version does not know, or started before a patch it retired). Exits
with status 1 when there is any such thread.
"""

from django.core.management.base import BaseCommand, CommandError

from runs import registry, selectors
from runs.management.commands._helpers import tenant_by_slug


def _statuses(row: selectors.VersionRow) -> str:
    if not row.by_status:
        return "no threads"
    return ", ".join(
        f"{count} {status}" for status, count in sorted(row.by_status.items())
    )


class Command(BaseCommand):
    help = "Report agent versions, their threads, and threads that cannot continue."

    def add_arguments(self, parser):
        parser.add_argument("--tenant", help="Only this tenant's threads (slug).")

    def handle(self, *args, tenant=None, **options):
        tenant = tenant_by_slug(tenant) if tenant else None
        rows = selectors.version_skew(tenant=tenant)
        specs = registry.agents()
        self.stdout.write("Registered agent versions:")
        for row in rows:
            spec = specs.get(f"{row.agent}@{row.version}")
            if spec is None or row.problem:
                continue
            known = ", ".join(sorted(spec.patches)) or "none"
            retired = ", ".join(sorted(spec.retired_patches))
            self.stdout.write(
                f"  {spec.key}{' (draining)' if spec.draining else ''}: "
                f"{_statuses(row)}; patches: {known}"
                + (f"; retired: {retired}" if retired else "")
            )
        problems = [row for row in rows if row.problem]
        if not problems:
            self.stdout.write(self.style.SUCCESS("Every thread can continue."))
            return
        self.stdout.write("Threads that cannot continue:")
        for row in problems:
            more = row.count - len(row.threads)
            self.stdout.write(
                f"  {row.agent}@{row.version}: {row.count} thread(s) "
                f"({_statuses(row)}): {row.problem}; "
                + ", ".join(row.threads)
                + (f" and {more} more" if more > 0 else "")
            )
        stuck = sum(row.count for row in problems)
        raise CommandError(
            f"{stuck} thread(s) cannot continue on the registered agents: register "
            "their version again, deploy a version that fits their patches, or "
            "migrate them (threads_migrate)"
        )
