"""Celery tasks of the runs app. Thin: the work is in runs.execution/services."""

from celery import shared_task

from runs import execution
from runs.services import runs_recover_stalled


@shared_task(name="runs.execute_run", acks_late=True, reject_on_worker_lost=True)
def execute_run(run_id: str) -> None:
    execution.execute(run_id)


@shared_task(name="runs.recover_stalled_runs")
def recover_stalled_runs() -> dict[str, int]:
    return runs_recover_stalled()
