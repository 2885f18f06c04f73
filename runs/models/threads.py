"""Threads: one conversation or case of an agent, and the key to its content."""

from __future__ import annotations

from typing import Any

from django.db import models, transaction
from django.db.models import Q
from django.utils import timezone

from runs import crypto
from runs.models.tenancy import Tenant, TenantOwnedQuerySet


def _new_data_key(tenant: Tenant, thread_pk: int) -> crypto.WrappedDataKey:
    """A fresh data key for the thread, wrapped by the active master key and
    bound to the thread's primary key."""
    return crypto.new_data_key(
        tenant_id=tenant.pk, owner=crypto.thread_key_owner(thread_pk)
    )


class ThreadQuerySet(TenantOwnedQuerySet):
    def for_tenant(
        self, tenant: Tenant, *, include_deleted: bool = False
    ) -> ThreadQuerySet:
        """The tenant's threads; a deleted thread's tombstone only on request."""
        queryset = super().for_tenant(tenant)
        return queryset if include_deleted else queryset.live()

    def live(self) -> ThreadQuerySet:
        return self.filter(deleted_at__isnull=True)

    def create_with_data_key(
        self, *, tenant: Tenant, thread_id: str, **fields: Any
    ) -> Thread:
        """A new thread with a fresh data key wrapped by the active master key.

        The wrap is bound to the thread's primary key, known once the row is
        inserted: the key is written in the same transaction, so no one ever
        sees the row without it.
        """
        with transaction.atomic(using=self.db, savepoint=False):
            thread = self.create(tenant=tenant, thread_id=thread_id, **fields)
            key = _new_data_key(tenant, thread.pk)
            self.filter(pk=thread.pk).update(
                wrapped_data_key=key.wrapped, data_key_id=key.key_id
            )
        thread.wrapped_data_key = key.wrapped
        thread.data_key_id = key.key_id
        return thread

    def unsaved_with_data_key(
        self, *, tenant: Tenant, thread_id: str, **fields: Any
    ) -> Thread | None:
        """On Postgres, a new thread not yet inserted, its primary key taken
        from the table's sequence first so that its data key is wrapped before
        the insert: one INSERT, with the key, for the caller to run in a
        statement of its own (runs.services.threads.thread_event's
        `inserts`), where create_with_data_key writes the row and then its
        key. None elsewhere (SQLite has no sequence to take from)."""
        connection = transaction.get_connection(self.db)
        if connection.vendor != "postgresql":
            return None
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT nextval(pg_get_serial_sequence(%s, 'id'))",
                [self.model._meta.db_table],
            )
            [(pk,)] = cursor.fetchall()
        key = _new_data_key(tenant, pk)
        return self.model(
            pk=pk,
            tenant=tenant,
            thread_id=thread_id,
            wrapped_data_key=key.wrapped,
            data_key_id=key.key_id,
            **fields,
        )


class Thread(models.Model):
    """A thread and its data key.

    `wrapped_data_key` null means the key was destroyed (crypto-shredding):
    nothing the thread stored can be read again. `deleted_at` set makes the
    row a tombstone: its content rows are gone, and the checkpoint store
    refuses any late write to it, so a run still in flight cannot bring a
    deleted thread back. A new thread may reuse the client's id.
    """

    class Status(models.TextChoices):
        IDLE = "idle", "Idle"
        RUNNING = "running", "Running"
        INTERRUPTED = "interrupted", "Interrupted"
        ERROR = "error", "Error"

    # No index of its own: both indexes below start with the tenant.
    tenant = models.ForeignKey(
        Tenant, on_delete=models.CASCADE, related_name="threads", db_index=False
    )
    thread_id = models.CharField(
        max_length=255, help_text="The client's id, unique within the tenant."
    )
    agent_name = models.CharField(max_length=100, blank=True)
    # Pinned by the first run; blank until then.
    agent_version = models.CharField(max_length=50, blank=True)
    # The patches of the version the thread started on (runs.patches): code
    # identifiers, not content.
    patches = models.JSONField(default=list, blank=True)
    # Steps a migration moved to a new checkpoint: {new task id: [checkpoint
    # namespace, checkpoint id, task id] of the step before the move}, so the
    # step keeps its identity (runs.context.step_key). Hashes, not content.
    step_aliases = models.JSONField(default=dict, blank=True)
    status = models.CharField(
        max_length=16, choices=Status.choices, default=Status.IDLE
    )
    # Plaintext: only keys the agent declares safe may be stored here.
    metadata = models.JSONField(default=dict, blank=True)
    # A keyed hash of the data subject, for deletion requests (blind index).
    subject_hash = models.CharField(max_length=64, blank=True)
    wrapped_data_key = models.BinaryField(null=True, editable=False)
    data_key_id = models.CharField(
        max_length=64, blank=True, editable=False, help_text="Master key that wraps it."
    )
    # Nodes that stopped at an approval gate on this thread (structure, not
    # content): with the agent's declared gated nodes, where runs.gates
    # refuses forks and replays that would pass a gate without its decision.
    gated_nodes = models.JSONField(default=list, blank=True, editable=False)
    # Set once a checkpoint uses a DeltaChannel: keep_latest cannot prune it.
    uses_delta_channels = models.BooleanField(default=False, editable=False)
    expires_at = models.DateTimeField(null=True, blank=True)
    legal_hold = models.BooleanField(default=False)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    updated_at = models.DateTimeField(auto_now=True)
    deleted_at = models.DateTimeField(null=True, blank=True, editable=False)

    objects = ThreadQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "thread_id"],
                condition=Q(deleted_at__isnull=True),
                name="thread_live_tenant_thread_id",
            )
        ]
        indexes = [
            # Serves the tombstone check as well as the live lookup.
            models.Index(
                fields=["tenant", "thread_id"], name="thread_tenant_thread_id"
            ),
            models.Index(fields=["tenant", "status"], name="thread_tenant_status"),
        ]
        ordering = ["tenant", "thread_id"]

    def __str__(self) -> str:
        suffix = " (deleted)" if self.deleted_at else ""
        return f"{self.tenant_id}/{self.thread_id}{suffix}"

    @property
    def is_shredded(self) -> bool:
        return self.wrapped_data_key is None
