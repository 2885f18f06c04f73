"""Recompute the audit chain of one tenant or all, and name the first bad event;
optionally check each chain against heads saved earlier by audit_anchor."""

import json
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from audit import anchors, sealing, services
from runs.models import Tenant


def read_heads(path: str) -> dict[int, anchors.SignedHead]:
    """The saved heads in a file of audit_anchor's output, by tenant id."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as error:
        raise CommandError(f"--against: cannot read {path}: {error.strerror}") from None
    heads = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            head = anchors.head_parse(json.loads(line))
        except (ValueError, anchors.InvalidHead) as error:
            raise CommandError(f"--against {path}, line {number}: {error}") from None
        heads[head.tenant_id] = head
    return heads


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
        parser.add_argument(
            "--against",
            metavar="FILE",
            help="heads saved earlier by audit_anchor: each tenant's chain must "
            "still hold its saved head (only the tenants in the file are checked)",
        )

    def handle(
        self,
        *args,
        tenant: str | None = None,
        seal: bool = False,
        against: str | None = None,
        **options,
    ):
        heads = read_heads(against) if against else {}
        tenants = Tenant.objects.order_by("slug")
        if against:
            missing = set(heads) - set(
                Tenant.objects.filter(pk__in=heads).values_list("pk", flat=True)
            )
            if missing:
                names = ", ".join(sorted(heads[pk].tenant for pk in missing))
                raise CommandError(f"--against names tenants that are gone: {names}")
            tenants = tenants.filter(pk__in=heads)
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
            try:
                result = services.audit_verify(
                    tenant=each,
                    checked_by="manage.py verify_audit",
                    against=heads.get(each.pk),
                )
            except anchors.InvalidHead as error:
                broken += 1
                self.stdout.write(f"{each.slug}: saved head refused: {error}")
                continue
            if result.ok:
                # The whole hash: it is what an operator compares with a saved
                # head (docs/audit.md, "Saved heads"); a prefix proves nothing.
                head = result.head_hash or "-"
                held = (
                    ""
                    if result.against_seq is None
                    else f"; holds the saved head #{result.against_seq}"
                )
                self.stdout.write(
                    f"{each.slug}: intact: {result.blocks} block(s), "
                    f"{result.events} event(s), {result.unsealed} not sealed yet; "
                    f"sealed through #{result.head_seq} (hash {head}){held}"
                )
            else:
                broken += 1
                self.stdout.write(
                    f"{each.slug}: BROKEN at seq {result.first_bad_seq}: "
                    f"{result.problem}"
                )
        if broken:
            raise CommandError(f"{broken} audit chain(s) do not verify.")
