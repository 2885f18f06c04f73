"""What each Celery worker adds to itself: asking for the recovery sweep of
stalled runs, so that recovery does not hang on one beat process staying
alive.

Every GATEHOUSE_RECOVERY_SWEEP_SECONDS each worker sends the
`runs.recover_stalled_runs` task, which beat schedules too; whichever worker
takes it sweeps, one sweep at a time (`runs.dispatch.runs_recover_stalled`
holds a database lock while it sweeps and skips when another holds it). A
worker adds this step to itself: config.celery registers it.
"""

from __future__ import annotations

import logging

from celery import bootsteps
from django.conf import settings

from runs import dispatch, outages

logger = logging.getLogger(__name__)


class RecoverySweep(bootsteps.StartStopStep):
    requires = ("celery.worker.components:Timer",)

    def __init__(self, worker, **kwargs) -> None:
        super().__init__(worker, **kwargs)
        self.timer_entry = None

    def start(self, worker) -> None:
        interval = settings.GATEHOUSE_RECOVERY_SWEEP_SECONDS
        if interval > 0:
            self.timer_entry = worker.timer.call_repeatedly(
                interval, self.request, (worker.app, interval), priority=10
            )

    def stop(self, worker) -> None:
        if self.timer_entry is not None:
            self.timer_entry.cancel()
            self.timer_entry = None

    @staticmethod
    def request(app, interval: float) -> None:
        try:
            # Expires with the next request: sweeps queued behind busy
            # workers do not pile up.
            app.send_task(dispatch.RECOVER_STALLED_RUNS, expires=interval)
        except outages.BROKER_ERRORS as error:
            logger.warning(
                "recovery sweep not requested, the broker is unavailable (%s)",
                type(error).__name__,
            )
