"""Print the signed head of each tenant's audit chain, to keep elsewhere."""

import json

from django.core.management.base import BaseCommand, CommandError

from audit import anchors
from runs.models import Tenant


class Command(BaseCommand):
    help = (
        "Print the signed head of each tenant's sealed audit chain, one JSON "
        "object a line. Keep the output where the database's administrators "
        "cannot write; `verify_audit --against FILE` checks it later."
    )

    def add_arguments(self, parser):
        parser.add_argument("--tenant", help="a tenant's slug (default: every tenant)")

    def handle(self, *args, tenant: str | None = None, **options):
        tenants = Tenant.objects.order_by("slug")
        if tenant:
            tenants = tenants.filter(slug=tenant)
            if not tenants.exists():
                raise CommandError(f"There is no tenant {tenant!r}.")
        broken = []
        for each in tenants.iterator():
            try:
                head = anchors.chain_head(tenant=each)
            except anchors.ChainHeadBroken as error:
                broken.append(each.slug)
                self.stderr.write(f"{each.slug}: no head to sign: {error}")
                continue
            self.stdout.write(json.dumps(head.as_dict(), sort_keys=True))
        if broken:
            raise CommandError(
                f"{len(broken)} chain(s) end in a block that does not verify: "
                f"{', '.join(broken)}; run verify_audit."
            )
