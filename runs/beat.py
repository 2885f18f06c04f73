"""Celery beat's scheduler: django-celery-beat's, surviving database outages.

`DatabaseScheduler` reads the schedule from the database on every change
and in full every five minutes (`all_as_schedule()`), without handling a
database error there: an outage at that moment ends beat, and with it the
sealing, escalation and retention jobs. This scheduler lets such a tick
pass, drops the dead connection, and reads the whole schedule again at the
next tick once the database answers (CELERY_BEAT_SCHEDULER names it).
"""

from __future__ import annotations

import logging
import time

from django_celery_beat.schedulers import DatabaseScheduler

from runs.outages import (
    DATABASE_ERRORS,
    RETRY_AFTER_SECONDS,
    is_database_outage,
    reconnect,
)

logger = logging.getLogger(__name__)


class OutageTolerantScheduler(DatabaseScheduler):
    def setup_schedule(self) -> None:
        # Beat started while the database is down waits for it, as a worker
        # waits for its broker, instead of exiting.
        while True:
            try:
                return super().setup_schedule()
            except DATABASE_ERRORS as error:
                self._outage(error)
                time.sleep(RETRY_AFTER_SECONDS)

    def tick(self, *args, **kwargs) -> float:
        try:
            return super().tick(*args, **kwargs)
        except DATABASE_ERRORS as error:
            self._outage(error)
            self._heap = None
            return RETRY_AFTER_SECONDS

    def _outage(self, error: BaseException) -> None:
        if not is_database_outage(error):
            raise error
        logger.warning(
            "beat: the database is unavailable (%s); retrying in %ss",
            type(error.__cause__ or error).__name__,
            RETRY_AFTER_SECONDS,
        )
        reconnect()
        # Read the whole schedule again when the database is back: entries
        # that fell due meanwhile run then, once.
        self._initial_read = True
