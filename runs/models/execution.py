"""Runs: one execution of an agent on a thread, and the lease that guards it."""

from __future__ import annotations

import uuid

from django.db import models
from django.db.models import Q
from django.utils import timezone

from runs.models.content import ThreadContent
from runs.models.tenancy import Tenant, TenantOwnedQuerySet
from runs.models.threads import Thread


class LeaseLost(RuntimeError):
    """A worker's run is no longer its own: its lease was taken by another
    worker (the recovery sweep handed the run on after the lease ran out: a
    frozen process, a partition), or the run stopped being `running`. What
    the worker does from then on reaches neither the thread's state nor the
    run's record (the late-write rule): its checkpoint writes are refused
    (runs.checkpointer), and it stops, recording nothing, no failure, no
    compensation, no event (runs.execution.execute). A RuntimeError, which
    LangGraph's default retry policy does not retry."""


class Run(models.Model):
    """A queued, running or finished execution of a thread's agent.

    `input` (start and replay runs) and `resume` (resume runs) are ciphertext
    from the thread's cipher, bound to this run's id. A running run holds a
    lease (`lease_owner`, `lease_until`) that its worker renews; a run whose
    lease ran out is taken over and continues from its last checkpoint.
    """

    class Status(models.TextChoices):
        QUEUED = "queued", "Queued"
        RUNNING = "running", "Running"
        INTERRUPTED = "interrupted", "Interrupted"
        SUCCEEDED = "succeeded", "Succeeded"
        FAILED = "failed", "Failed"
        CANCELLED = "cancelled", "Cancelled"

    class Kind(models.TextChoices):
        START = "start", "Start"
        RESUME = "resume", "Resume"
        REPLAY = "replay", "Replay"
        # Continues a failed run from the thread's latest checkpoint.
        RETRY = "retry", "Retry"

    class Multitask(models.TextChoices):
        """What a new run does when the thread already has an active run."""

        REJECT = "reject", "Reject"
        ENQUEUE = "enqueue", "Enqueue"
        INTERRUPT = "interrupt", "Interrupt the active run"
        ROLLBACK = "rollback", "Roll back the active run"

    class CancelAction(models.TextChoices):
        # Stop the run where it is; its checkpoints stay.
        INTERRUPT = "interrupt", "Interrupt"
        # Stop the run and delete the checkpoints it wrote.
        ROLLBACK = "rollback", "Roll back"

    class Compensation(models.TextChoices):
        """How far a failed run got in undoing what it did (runs.compensation):
        `status` stays within the API's run statuses, this says the rest."""

        NONE = "", "Nothing to undo"
        COMPENSATING = "compensating", "Undoing its completed steps"
        COMPENSATED = "compensated", "Every completed step undone"
        FAILED = "failed", "A step could not be undone"

    ACTIVE = (Status.QUEUED, Status.RUNNING)

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    thread = models.ForeignKey(Thread, on_delete=models.CASCADE, related_name="runs")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    status = models.CharField(
        max_length=16, choices=Status.choices, default=Status.QUEUED
    )
    # The agent version this run executes; the thread's pinned version.
    agent_version = models.CharField(max_length=50)
    # Time travel: continue from this checkpoint instead of the latest.
    checkpoint_id = models.CharField(max_length=64, blank=True)
    input = models.BinaryField(null=True, editable=False)
    resume = models.BinaryField(null=True, editable=False)
    # Who asked for the run, for the audit trail (a label, not personal data).
    requested_by = models.CharField(max_length=200, blank=True)
    lease_owner = models.CharField(max_length=200, blank=True)
    lease_until = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    # Encrypted: an agent's exception text may quote what it was processing.
    error = models.BinaryField(null=True, editable=False)
    error_type = models.CharField(max_length=200, blank=True)
    compensation = models.CharField(
        max_length=16, choices=Compensation.choices, blank=True
    )
    # The graph nodes the run stopped before (structure, not content): a
    # resume under a graph that lacks one of them is refused as version skew.
    next_nodes = models.JSONField(default=list, blank=True)
    # Plaintext, like the thread's: only keys the agent declares safe.
    metadata = models.JSONField(default=dict, blank=True)
    multitask_strategy = models.CharField(
        max_length=16, choices=Multitask.choices, default=Multitask.REJECT
    )
    # LangGraph stream modes the worker publishes (runs.streaming); a run
    # always publishes its start and its end, whatever these are.
    stream_modes = models.JSONField(default=list, blank=True)
    stream_subgraphs = models.BooleanField(default=False)
    # Set on a running run that was cancelled: its worker stops at the next
    # step and records the run cancelled (runs.execution).
    cancel_action = models.CharField(
        max_length=16, choices=CancelAction.choices, blank=True
    )
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    objects = TenantOwnedQuerySet.as_manager()

    # Cleared when the thread is removed (runs.storage.content_clear).
    thread_content = (
        ThreadContent("run_contents", fields=("input", "resume", "error")),
    )

    class Meta:
        indexes = [
            models.Index(fields=["thread", "created_at"], name="run_thread_created"),
            # The recovery sweep: running runs by lease expiry.
            models.Index(
                fields=["lease_until"],
                condition=Q(status="running"),
                name="run_running_lease",
            ),
            models.Index(
                fields=["created_at"], condition=Q(status="queued"), name="run_queued"
            ),
        ]
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.kind} run {self.id} ({self.status})"

    @property
    def is_active(self) -> bool:
        return self.status in self.ACTIVE

    # The lease: a run is its worker's while it is `running` with the worker's
    # `lease_owner` (a token new at every claim, runs.execution). Whatever the
    # worker writes for the run checks this, with the row locked, in the
    # statement or transaction that writes: the renewal, the compensation's
    # start, the finish (held_by; its one-statement success, in
    # runs.execution, states the same condition in its own SQL), and the
    # checkpoint store's writes (LEASE_HELD_SQL).

    @classmethod
    def held(cls, run_id, owner: str) -> models.QuerySet:
        """The run, if it is still `owner`'s (see above)."""
        return cls.objects.filter(
            pk=run_id, lease_owner=owner, status=cls.Status.RUNNING
        )

    def held_by(self, owner: str) -> bool:
        """This row, as read, is still `owner`'s."""
        return self.lease_owner == owner and self.status == self.Status.RUNNING


# Run.held in SQL over the run's table aliased `r`; its parameters are the
# run's id and the owner.
LEASE_HELD_SQL = (
    f"r.id = %s AND r.lease_owner = %s AND r.status = '{Run.Status.RUNNING.value}'"
)
