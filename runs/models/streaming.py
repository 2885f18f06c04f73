"""Stream events of runs, for the database backend of runs.streaming."""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from runs.models.content import ThreadContent
from runs.models.execution import Run


class RunStreamEvent(models.Model):
    """One event a worker published while it executed a run.

    Used when no Redis is configured (the embedded mode); with Redis the
    events live in a Redis stream instead. `data` is ciphertext of the run's
    thread, bound to the run and the event's id: the events carry thread
    content. Rows expire with GATEHOUSE_STREAM_TTL_SECONDS (a beat job).
    """

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="+")
    # The event's id is "<attempt>-<seq>": the claim attempt that published
    # it, and its place in that attempt.
    attempt = models.PositiveIntegerField()
    seq = models.PositiveIntegerField()
    event = models.CharField(max_length=200)
    data = models.BinaryField()
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    # Deleted when the thread is removed (runs.storage.content_clear).
    thread_content = (ThreadContent("stream_events", thread="run__thread"),)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["run", "attempt", "seq"], name="run_stream_event_position"
            )
        ]

    def __str__(self) -> str:
        return f"{self.run_id} {self.attempt}-{self.seq} {self.event}"
