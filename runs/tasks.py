"""Celery tasks of the runs app. Thin: the work is in runs.execution and
runs.dispatch, which names these tasks (so it does not import them)."""

from celery import shared_task

from runs import dispatch, execution, streaming


@shared_task(name=dispatch.EXECUTE_RUN, acks_late=True, reject_on_worker_lost=True)
def execute_run(run_id: str) -> None:
    execution.execute(run_id)


@shared_task(name=dispatch.RECOVER_STALLED_RUNS)
def recover_stalled_runs() -> dict[str, int]:
    return dispatch.runs_recover_stalled()


@shared_task(name="runs.expire_stream_events")
def expire_stream_events() -> int:
    return streaming.expire_events()
