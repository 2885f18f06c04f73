"""Recompute the audit chain of one tenant or all, and name the first bad event."""

from django.core.management.base import BaseCommand, CommandError

from audit import sealing, services
from runs.models import Tenant


class Command(BaseCommand):
    help = (
        "Recompute each tenant's sealed audit chain; exit 1 naming the first "
        "event that does not match."
    )

    def add_arguments(self, parser):
        parser.add_argument("--tenant", help="a tenant's slug (default: every tenant)")
        parser.add_argument(
            "--seal",
            action="store_true",
            help="seal pending events first, so that all of them are checked",
        )

    def handle(self, *args, tenant: str | None = None, seal: bool = False, **options):
        tenants = Tenant.objects.order_by("slug")
        if tenant:
            tenants = tenants.filter(slug=tenant)
            if not tenants.exists():
                raise CommandError(f"There is no tenant {tenant!r}.")
        if seal:
            report = sealing.seal_all()
            self.stdout.write(
                f"sealed {report.events} event(s) in {report.blocks} block(s)"
            )
        broken = 0
        for each in tenants.iterator():
            result = services.audit_verify(
                tenant=each, checked_by="manage.py verify_audit"
            )
            if result.ok:
                head = result.head_hash[:16] or "-"
                self.stdout.write(
                    f"{each.slug}: intact: {result.blocks} block(s), "
                    f"{result.events} event(s), {result.unsealed} not sealed yet; "
                    f"sealed through #{result.head_seq} (hash {head})"
                )
            else:
                broken += 1
                self.stdout.write(
                    f"{each.slug}: BROKEN at seq {result.first_bad_seq}: "
                    f"{result.problem}"
                )
        if broken:
            raise CommandError(f"{broken} audit chain(s) do not verify.")
