"""Move the paused threads of one agent version to another with a function.

    manage.py threads_migrate --agent refund --from 1 --to 2 \\
        --with package.module:function [--dry-run] [--tenant slug]

The function takes a thread's state (a dict, a copy) and returns the state the
new version expects. Each idle or interrupted thread of agent@from is migrated
in its own transaction (runs.services.migration): a new checkpoint under the
new version, its interrupts carried over, `thread.migrated` audited. A thread
that cannot be migrated is reported with the reason and left untouched.
`--dry-run` reports, per thread, the keys that would be added, removed and
changed (names only, never values) and writes nothing. Exits with status 1 when
any thread could not be migrated.
"""

from django.core.management.base import BaseCommand, CommandError
from django.utils.module_loading import import_string

from audit.services import Actor
from runs import registry
from runs.management.commands._helpers import progress_bar, tenant_by_slug
from runs.services.migration import (
    ThreadMigration,
    migration_candidates,
    thread_migrate,
)


def _keys(sign: str, names: list[str]) -> str:
    return f"{sign}{len(names)} ({', '.join(names)})" if names else ""


def describe(migration: ThreadMigration) -> str:
    parts = [
        _keys("+", migration.added),
        _keys("-", migration.removed),
        _keys("~", migration.changed),
    ]
    return " ".join(part for part in parts if part) or "no key changes"


class Command(BaseCommand):
    help = "Migrate the paused threads of agent@from to agent@to with a function."

    def add_arguments(self, parser):
        parser.add_argument("--agent", required=True, help="The agent's name.")
        parser.add_argument("--from", dest="source", required=True, help="Version.")
        parser.add_argument("--to", dest="target", required=True, help="Version.")
        parser.add_argument(
            "--with",
            dest="function",
            required=True,
            help="package.module:function, state dict -> state dict.",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="Report; change nothing."
        )
        parser.add_argument("--tenant", help="Only this tenant's threads (slug).")
        parser.add_argument(
            "--batch-size",
            type=int,
            default=100,
            help="Threads read per query (default 100); each is its own transaction.",
        )

    def handle(self, *args, **options):
        agent, source, target = options["agent"], options["source"], options["target"]
        if source == target:
            raise CommandError("--from and --to name the same version")
        if options["batch_size"] < 1:
            raise CommandError("--batch-size must be at least 1")
        try:
            spec = registry.get(agent, target)
        except registry.UnknownAgent as exc:
            raise CommandError(f"{exc}; register it before migrating to it") from None
        function_name = options["function"]
        try:
            migrate = import_string(function_name.replace(":", "."))
        except ImportError as exc:
            raise CommandError(f"cannot import {function_name}: {exc}") from None
        tenant = tenant_by_slug(options["tenant"]) if options["tenant"] else None
        threads = migration_candidates(agent=agent, version=source, tenant=tenant)
        dry_run = options["dry_run"]
        verb = "would migrate" if dry_run else "migrated"
        actor = Actor.system("threads_migrate")
        done, stuck = 0, 0
        with progress_bar(
            self,
            verbosity=options["verbosity"],
            total=threads.count(),
            unit="thread",
            desc=f"{agent}@{source} -> {agent}@{target}",
        ) as bar:
            for thread in self._batches(threads, options["batch_size"]):
                migration = thread_migrate(
                    thread=thread,
                    target=spec,
                    migrate=migrate,
                    function_name=function_name,
                    actor=actor,
                    dry_run=dry_run,
                )
                if migration.problem:
                    stuck += 1
                    line = (
                        f"{migration.label}: cannot migrate: {migration.problem}; "
                        "left untouched"
                    )
                else:
                    done += 1
                    line = f"{migration.label}: {verb}: {describe(migration)}"
                with bar.external_write_mode():
                    self.stdout.write(line)
                bar.update()
        self.stdout.write(
            f"{agent}@{source} -> {agent}@{target}: {done} thread(s) {verb}, "
            f"{stuck} cannot be migrated."
        )
        if stuck:
            raise CommandError(f"{stuck} thread(s) could not be migrated")

    def _batches(self, threads, size: int):
        """Every candidate, reading `size` at a time by primary key."""
        last = 0
        while True:
            batch = list(threads.select_related("tenant").filter(pk__gt=last)[:size])
            if not batch:
                return
            yield from batch
            last = batch[-1].pk
