"""Seal again, under the audit key, the blocks sealed before seals were keyed."""

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from audit import legacy
from runs.models import Tenant


class Command(BaseCommand):
    help = (
        "Once after upgrading: verify each tenant's chain, unkeyed blocks with "
        "their old formula, and seal those blocks again under the active audit "
        "key. A broken chain is reported and left as it is. Run it as the "
        "database's owner role."
    )

    def handle(self, *args, **options):
        broken = 0
        for tenant in Tenant.objects.order_by("slug").iterator():
            try:
                result = legacy.reseal_legacy(tenant_id=tenant.pk)
            except DatabaseError as error:
                raise CommandError(
                    f"{tenant.slug}: {error}".strip()
                    + " (run this command as the owner of the audit tables)"
                ) from None
            if not result.ok:
                broken += 1
                self.stdout.write(
                    f"{tenant.slug}: BROKEN at {result.problem}; left as it is"
                )
            elif result.blocks:
                self.stdout.write(
                    f"{tenant.slug}: {result.blocks} block(s) sealed again under "
                    f"the audit key; head #{result.head_seq} was "
                    f"{result.old_head_hash}, is now {result.new_head_hash}"
                )
            else:
                self.stdout.write(f"{tenant.slug}: nothing to seal again")
        if broken:
            raise CommandError(
                f"{broken} chain(s) do not verify; nothing sealed there."
            )
