"""Reads of retention: what a deletion request would cover, before it is made."""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import QuerySet

from approvals.models import ApprovalRequest
from retention.models import LegalHold
from runs.models import Tenant, Thread
from runs.services.threads import subject_hash

# A confirmation page lists this many threads and approvals, and counts the rest.
PREVIEW_LIMIT = 200


def subject_threads(tenant: Tenant, subject: str) -> QuerySet[Thread]:
    """The tenant's live threads tagged with this data subject (by its blind
    index: the subject itself is never stored)."""
    return Thread.objects.for_tenant(tenant).filter(subject_hash=subject_hash(subject))


@dataclass(frozen=True)
class DeletionPreview:
    """What a deletion request would do, for the person about to confirm it."""

    threads: list[Thread]  # the live threads it matches (up to PREVIEW_LIMIT)
    thread_count: int
    held: frozenset[int]  # pks of those that would wait for a legal hold
    tenant_held: bool  # a hold on the whole tenant: every thread waits
    open_approvals: list[ApprovalRequest]  # pending on those threads: closed
    open_approval_count: int

    @property
    def matched(self) -> bool:
        return self.thread_count > 0


def deletion_preview(
    *, tenant: Tenant, subject: str = "", thread_id: str = ""
) -> DeletionPreview:
    """The threads a request for `subject` (or for one `thread_id`) would
    delete now, those a legal hold would keep waiting, and the pending
    approval requests on them, which accepting the request closes."""
    if subject:
        threads = subject_threads(tenant, subject)
    else:
        threads = Thread.objects.for_tenant(tenant).filter(thread_id=thread_id)
    listed = list(threads.order_by("created_at", "pk")[:PREVIEW_LIMIT])
    tenant_held = LegalHold.objects.filter(tenant=tenant).active().on_tenant().exists()
    pending = (
        ApprovalRequest.objects.filter(
            thread__in=threads, status=ApprovalRequest.Status.PENDING
        )
        .select_related("thread", "assignment__assignee")
        .order_by("created_at", "pk")
    )
    return DeletionPreview(
        threads=listed,
        thread_count=threads.count(),
        held=frozenset(
            thread.pk for thread in listed if tenant_held or thread.legal_hold
        ),
        tenant_held=tenant_held,
        open_approvals=list(pending[:PREVIEW_LIMIT]),
        open_approval_count=pending.count(),
    )
