"""Rewrap every thread's data key under the active master key.

Put the new key first in GATEHOUSE_MASTER_KEYS (keeping the old ones), restart,
run this, then remove the old keys. Checkpoints are not re-encrypted: only the
wrapped data keys change. Safe to interrupt, to rerun and to run while runs
are writing.
"""

import argparse

from django.core.management.base import BaseCommand, CommandError
from django.db import DEFAULT_DB_ALIAS, transaction

from audit import events
from audit.services import Actor, record
from runs import crypto, storage
from runs.management.commands._helpers import progress_bar
from runs.models import Tenant, Thread


class Command(BaseCommand):
    help = (
        "Rewrap every thread's data key under the active (first) master key of "
        "GATEHOUSE_MASTER_KEYS, in batches; re-encrypts no checkpoint."
    )
    # Shown after the options by --help: the whole procedure, of which this
    # command is the second step (docs/checkpoints.md, "Master key rotation").
    procedure = """\
procedure:
  1. Generate a key and put it FIRST in GATEHOUSE_MASTER_KEYS, keeping the old
     ones (k2:<base64 of 32 random bytes>,k1:...):
       python -c "import base64,os;print('k2:'+base64.b64encode(os.urandom(32)).decode())"
     Restart the web, worker and beat processes: new threads get keys wrapped
     by k2.
  2. Run this command. It rewraps, batch by batch, every data key not yet
     under the first key; runs keep writing meanwhile. Safe to interrupt and
     to run again; threads being deleted at that moment are counted as busy.
  3. When it reports nothing busy and no key missing, and says the old keys
     may leave, remove them from GATEHOUSE_MASTER_KEYS, restart, and destroy
     every copy of them (backups taken before deletions stay readable with
     the old key until it is destroyed).
See docs/checkpoints.md, "Master key rotation".
"""

    def create_parser(self, prog_name, subcommand, **kwargs):
        parser = super().create_parser(
            prog_name,
            subcommand,
            formatter_class=argparse.RawDescriptionHelpFormatter,
            **kwargs,
        )
        parser.epilog = self.procedure
        return parser

    def add_arguments(self, parser):
        parser.add_argument(
            "--batch-size",
            type=int,
            default=500,
            help="Threads rewrapped per transaction (default 500).",
        )
        parser.add_argument(
            "--database",
            default=DEFAULT_DB_ALIAS,
            help="Database alias (default 'default').",
        )

    def handle(self, *args, batch_size: int, database: str, verbosity: int, **options):
        if batch_size < 1:
            raise CommandError("--batch-size must be at least 1")
        ring = crypto.keyring()
        pending = (
            Thread.objects.using(database)
            .filter(wrapped_data_key__isnull=False)
            .exclude(data_key_id=ring.active_id)
            .count()
        )
        with progress_bar(
            self,
            verbosity=verbosity,
            total=pending,
            unit="thread",
            desc=f"rewrapping under {ring.active_id}",
        ) as bar:
            summary = storage.data_keys_rotate(
                batch_size=batch_size, using=database, on_progress=bar.update
            )
        self._audit(summary, database)
        self.stdout.write(
            f"Active master key {summary.key_id}: rewrapped {summary.rewrapped}, "
            f"already current {summary.already_current}, "
            f"shredded {summary.shredded}, busy {summary.busy}."
        )
        for label, count in sorted(summary.rewrapped_other.items()):
            self.stdout.write(f"Also rewrapped {count} key(s) of {label}.")
        if summary.busy:
            self.stdout.write(
                f"{summary.busy} threads were locked by a deletion in progress; "
                "run the command again."
            )
        if summary.unreadable:
            missing = ", ".join(
                f"{key_id} ({count} threads)"
                for key_id, count in sorted(summary.unreadable.items())
            )
            raise CommandError(
                f"data keys wrapped by master keys missing from "
                f"GATEHOUSE_MASTER_KEYS: {missing}. Put those keys back in the "
                "ring and run the command again; do not remove a key before it "
                "wraps no thread."
            )
        if not summary.busy:
            others = [key_id for key_id in ring.keys if key_id != ring.active_id]
            if others:
                self.stdout.write(
                    f"No thread uses {', '.join(others)} any more; they may "
                    "leave GATEHOUSE_MASTER_KEYS."
                )

    def _audit(self, summary: storage.RotationSummary, database: str) -> None:
        # One event per tenant whose keys moved, so each tenant's auditors
        # see it in their own trail.
        actor = Actor.system("rotate_master_key")
        tenants = Tenant.objects.using(database).in_bulk(
            list(summary.rewrapped_by_tenant)
        )
        for tenant_pk, count in sorted(summary.rewrapped_by_tenant.items()):
            with transaction.atomic(using=database):
                record(
                    tenant=tenants[tenant_pk],
                    kind=events.MASTER_KEY_ROTATED,
                    actor=actor,
                    action="rotate_master_key",
                    data={"key_id": summary.key_id, "rewrapped": count},
                )
