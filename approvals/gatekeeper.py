"""What approvals tells runs about a thread's gates (runs.gates.Gatekeeper).

Registered when the app starts (ApprovalsConfig.ready), so that runs enforces
the gate without importing approvals: a gated interrupt is resumed only with
the value its settled request stored (approvals.services.lifecycle.approval_settle).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from approvals.content import resume_value_of
from approvals.models import ApprovalRequest
from runs.crypto import ThreadCipher
from runs.models import Thread


class ApprovalGatekeeper:
    def open_requests(
        self, thread: Thread, interrupt_ids: Collection[str] | None = None
    ) -> list[str]:
        pending = ApprovalRequest.objects.filter(
            thread_id=thread.pk, status=ApprovalRequest.Status.PENDING
        )
        if interrupt_ids is not None:
            pending = pending.filter(interrupt_id__in=list(interrupt_ids))
        return [
            str(pk)
            for pk in pending.order_by("created_at").values_list("pk", flat=True)
        ]

    def decided_resumes(
        self, thread: Thread, interrupt_ids: Collection[str]
    ) -> dict[str, Any]:
        settled = list(
            ApprovalRequest.objects.filter(
                thread_id=thread.pk,
                interrupt_id__in=list(interrupt_ids),
                status__in=ApprovalRequest.SETTLED,
                resume_value__isnull=False,
            )
        )
        if not settled:
            return {}
        cipher = ThreadCipher.for_thread(thread)
        return {
            request.interrupt_id: resume_value_of(request, cipher)
            for request in settled
        }
