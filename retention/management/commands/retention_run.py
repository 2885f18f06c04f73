"""manage.py retention_run [job ...] [--dry-run]: run retention jobs once, now.

Without a job name every job runs once, in the order of retention.jobs.JOBS.
With --dry-run nothing changes: each job lists what it would do. Each job
shows a progress bar on one line of stderr; the run can be interrupted at any
time (the open batch is rolled back and the next run does it again).
"""

from __future__ import annotations

import logging

from django.core.management.base import BaseCommand, CommandError

from retention.jobs import JOBS, describe_counts, job_run
from runs.management.commands._helpers import progress_bar
from runs.sweeps import ERRORS


class Command(BaseCommand):
    help = (
        "Run retention jobs once (all of them without a name): "
        + ", ".join(JOBS)
        + ". --dry-run shows what each would do."
    )

    def add_arguments(self, parser):
        parser.add_argument("jobs", nargs="*", metavar="job", help="job names")
        parser.add_argument(
            "--dry-run", action="store_true", help="change nothing; list the work"
        )
        parser.add_argument(
            "--batch-size", type=int, default=None, help="rows per transaction"
        )
        parser.add_argument(
            "--limit",
            type=int,
            default=20,
            help="items listed per job in a dry run (0: all)",
        )

    def handle(self, *args, jobs, dry_run, batch_size, limit, verbosity, **options):
        unknown = [name for name in jobs if name not in JOBS]
        if unknown:
            raise CommandError(
                f"unknown job {', '.join(unknown)}; jobs: {', '.join(JOBS)}"
            )
        if batch_size is not None and batch_size < 1:
            raise CommandError("--batch-size must be at least 1")
        # This command reports each job itself; the jobs' log line would repeat it.
        logger = logging.getLogger("retention.jobs")
        level = logger.level
        logger.setLevel(logging.WARNING)
        try:
            for name in jobs or list(JOBS):
                self._run(
                    name,
                    dry_run=dry_run,
                    batch_size=batch_size,
                    limit=limit,
                    verbosity=verbosity,
                )
        finally:
            logger.setLevel(level)

    def _run(
        self, name: str, *, dry_run: bool, batch_size, limit: int, verbosity: int
    ) -> None:
        job = JOBS[name]
        label = f"{name}{' (dry run)' if dry_run else ''}"
        self.stdout.write(f"{label}: {job.summary}")
        with progress_bar(
            self, verbosity=verbosity, unit=job.unit, desc=f"  {name}"
        ) as bar:
            report = job_run(
                name, dry_run=dry_run, batch_size=batch_size, progress=bar.update
            )
        if dry_run:
            shown = report.plan if limit == 0 else report.plan[:limit]
            for line in shown:
                self.stdout.write(f"  would {line}")
            if len(report.plan) > len(shown):
                self.stdout.write(f"  … and {len(report.plan) - len(shown)} more")
        verb = "would do" if dry_run else "done"
        summary = f"  {verb}: {describe_counts(report.totals)} ({report.seconds:.1f} s)"
        errors = report.totals[ERRORS]
        if not errors:
            self.stdout.write(self.style.SUCCESS(summary))
            return
        self.stdout.write(self.style.WARNING(summary))
        self.stdout.write(
            self.style.WARNING(
                f"  {errors} failed and were skipped (the others went on); the "
                "next run tries them again. Which, and why: the log of runs.sweeps."
            )
        )
