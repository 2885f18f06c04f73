"""What the Agent Protocol adds to a run: its own webhook."""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from runs.models import Run, ThreadContent
from webhooks.models import WebhookSubscription


class RunWebhook(models.Model):
    """Where a run created with `webhook=` posts its result when it ends.

    The URL is on the origin of one of the tenant's webhook subscriptions,
    whose secret signs the message; it is stored encrypted with the thread's
    key (a URL may carry a token).
    """

    run = models.OneToOneField(
        Run, on_delete=models.CASCADE, primary_key=True, related_name="+"
    )
    subscription = models.ForeignKey(
        WebhookSubscription, on_delete=models.CASCADE, related_name="+"
    )
    sealed_url = models.BinaryField(editable=False)
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    # Deleted when the thread is removed (runs.storage.content_clear).
    thread_content = (ThreadContent("run_webhooks", thread="run__thread"),)

    def __str__(self) -> str:
        return f"webhook of run {self.run_id}"
