"""Reads of threads and runs that are more than a line."""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import uuid
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.db.models import Count, Min, QuerySet
from django.utils import timezone
from langgraph.types import Interrupt

from runs import patches, registry
from runs.crypto import ThreadCipher
from runs.fixed_queries import FixedQuery
from runs.graphs import compile_for, thread_config
from runs.models import Checkpoint, Run, Tenant, Thread

IN_FLIGHT = (Thread.Status.RUNNING, Thread.Status.INTERRUPTED)


def jsonable(value: Any) -> Any:
    """State values as JSON: messages and models as their fields."""
    # The usual values first, by their exact types: the checks below, against
    # ABCs and unions, cost more than these values' conversion (a run's end
    # event walks its state's values with this).
    kind = type(value)
    if kind is str or kind is int or kind is float or kind is bool or value is None:
        return value
    if kind is dict:
        return {str(key): jsonable(item) for key, item in value.items()}
    if kind is list or kind is tuple:
        return [jsonable(item) for item in value]
    if isinstance(value, Mapping):
        return {str(key): jsonable(item) for key, item in value.items()}
    if isinstance(value, Interrupt):
        # As LangGraph's API shows one; a schema only when the graph gave one.
        shown = {"value": jsonable(value.value), "id": value.id}
        if getattr(value, "response_schema", None) is not None:
            shown["response_schema"] = jsonable(value.response_schema)
        return shown
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(item) for item in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, decimal.Decimal | uuid.UUID):
        return str(value)
    if isinstance(value, datetime.datetime | datetime.date):
        return value.isoformat()
    if hasattr(value, "model_dump"):
        return jsonable(value.model_dump())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return jsonable(dataclasses.asdict(value))
    return str(value)


# What a caller who may not read decrypted content sees in its place.
WITHHELD = "content withheld: reading it needs the threads.read_state permission"


def interrupts_of(snapshot) -> list[dict[str, Any]]:
    return [
        {"id": item.id, "value": jsonable(item.value)} for item in snapshot.interrupts
    ]


def thread_interrupts(thread: Thread) -> list[dict[str, Any]]:
    if thread.status != Thread.Status.INTERRUPTED or not thread.agent_version:
        return []
    return interrupts_of(compile_for(thread).get_state(thread_config(thread)))


def pending_approval_ids(thread: Thread) -> list[uuid.UUID]:
    # Through the reverse relation that approvals declares: runs does not
    # import approvals.
    return list(
        thread.approval_requests.filter(status="pending")
        .order_by("created_at")
        .values_list("id", flat=True)
    )


def state_body(snapshot) -> dict[str, Any]:
    parent = snapshot.parent_config or {}
    return {
        "checkpoint_id": snapshot.config["configurable"]["checkpoint_id"],
        "parent_checkpoint_id": parent.get("configurable", {}).get("checkpoint_id"),
        "values": jsonable(snapshot.values),
        "next": list(snapshot.next),
        "interrupts": interrupts_of(snapshot),
        "metadata": jsonable(snapshot.metadata or {}),
        "created_at": snapshot.created_at,
    }


def thread_history(thread: Thread, *, limit: int, before: str | None) -> list[dict]:
    if not thread.agent_version:
        return []
    graph = compile_for(thread)
    before_config = thread_config(thread, before, field="before") if before else None
    entries = []
    for snapshot in graph.get_state_history(
        thread_config(thread), limit=limit, before=before_config
    ):
        parent = snapshot.parent_config or {}
        metadata = snapshot.metadata or {}
        entries.append(
            {
                "checkpoint_id": snapshot.config["configurable"]["checkpoint_id"],
                "parent_checkpoint_id": parent.get("configurable", {}).get(
                    "checkpoint_id"
                ),
                "step": metadata.get("step"),
                "source": metadata.get("source"),
                "next": list(snapshot.next),
                "created_at": snapshot.created_at,
            }
        )
    return entries


def threads_in_flight(tenant: Tenant) -> dict[tuple[str, str], int]:
    """(agent, version) -> the tenant's threads running or waiting on an interrupt."""
    rows = (
        Thread.objects.for_tenant(tenant)
        .filter(status__in=IN_FLIGHT)
        .values("agent_name", "agent_version")
        .annotate(count=Count("pk"))
    )
    return {(row["agent_name"], row["agent_version"]): row["count"] for row in rows}


@dataclasses.dataclass
class VersionRow:
    """Live threads pinned to one agent version, by status; `problem` says why
    no registered code can continue them ("" when it can)."""

    agent: str
    version: str
    problem: str = ""
    by_status: dict[str, int] = dataclasses.field(default_factory=dict)
    threads: list[str] = dataclasses.field(default_factory=list)

    @property
    def count(self) -> int:
        return sum(self.by_status.values())


def version_skew(*, tenant: Tenant | None = None, sample: int = 5) -> list[VersionRow]:
    """Every agent version live threads are pinned to, registered or not, and
    which of them cannot continue: their version is gone, or their patches do
    not fit it (runs.patches). `threads` names up to `sample` of those, as
    "tenant/thread_id"."""
    threads = Thread.objects.live().exclude(agent_version="")
    if tenant is not None:
        threads = threads.for_tenant(tenant)
    specs = registry.agents()
    rows: dict[tuple[str, str, str], VersionRow] = {}
    for spec in specs.values():
        rows[(spec.name, spec.version, "")] = VersionRow(spec.name, spec.version)
    groups = threads.values("agent_name", "agent_version", "patches", "status")
    for group in groups.annotate(count=Count("pk")).order_by():
        agent, version = group["agent_name"], group["agent_version"]
        spec = specs.get(f"{agent}@{version}")
        problem = (
            patches.misfit(group["patches"], spec)
            if spec
            else f"agent {agent}@{version} is not registered"
        )
        row = rows.setdefault(
            (agent, version, problem), VersionRow(agent, version, problem)
        )
        row.by_status[group["status"]] = (
            row.by_status.get(group["status"], 0) + group["count"]
        )
        if problem and len(row.threads) < sample:
            row.threads += [
                f"{slug}/{thread_id}"
                for slug, thread_id in threads.filter(
                    agent_name=agent, agent_version=version, patches=group["patches"]
                ).values_list("tenant__slug", "thread_id")[: sample - len(row.threads)]
            ]
    return sorted(rows.values(), key=lambda row: (row.agent, row.version, row.problem))


# A tenant's live thread by its client's id, and a run of it: the lookups of
# most API requests (both APIs), compiled once per process
# (runs.fixed_queries). A live thread's id is unique in its tenant (Thread's
# constraint), a run's id everywhere: no ordering.
_LIVE_THREAD = FixedQuery(
    lambda tenant_pk, thread_id: (
        Thread.objects.for_tenant(tenant_pk)
        .select_related("tenant")
        .filter(thread_id=thread_id)
        .order_by()
    ),
    -1,
    "\x00sample thread id",
)
_LIVE_RUN = FixedQuery(
    lambda tenant_pk, thread_id, run_id: (
        Run.objects.for_tenant(tenant_pk)
        .filter(
            thread__tenant=tenant_pk,
            thread__thread_id=thread_id,
            thread__deleted_at__isnull=True,
            pk=run_id,
        )
        .select_related("thread__tenant")
        .order_by()
    ),
    -1,
    "\x00sample thread id",
    uuid.UUID("5a3b1e00-0000-4000-8000-00000000a9a1"),
)


def live_thread(tenant: Tenant, thread_id: str) -> Thread | None:
    """The tenant's live thread `thread_id`, with its tenant; another
    tenant's, or a deleted one, is None."""
    # str(): what the ORM's CharField makes of an id a request body carries.
    return _first(_LIVE_THREAD(tenant.pk, str(thread_id)))


def live_run(tenant: Tenant, thread_id: str, run_id) -> Run | None:
    """Run `run_id` of the tenant's live thread `thread_id`, with the thread
    and its tenant, in one statement; None otherwise."""
    return _first(_LIVE_RUN(tenant.pk, str(thread_id), uuid.UUID(str(run_id))))


def _first(rows: list) -> Any:
    return rows[0] if rows else None


def waiting_nodes_query(thread_id) -> QuerySet:
    """The next nodes of the thread's last interrupted run, as a query of one
    value at most: `thread_id` a thread's pk, or an OuterRef when the worker's
    claim reads it inside its locking statement."""
    return (
        Run.objects.filter(thread_id=thread_id, status=Run.Status.INTERRUPTED)
        .order_by("-created_at")
        .values_list("next_nodes", flat=True)[:1]
    )


def waiting_nodes(thread: Thread) -> list[str]:
    """The graph nodes the thread's last interrupted run stopped before."""
    last = next(iter(waiting_nodes_query(thread.pk)), None)
    return list(last or [])


def run_error_text(run: Run) -> str | None:
    """The decrypted error of a failed run."""
    if run.error is None:
        return None
    cipher = ThreadCipher.for_thread(run.thread)
    return cipher.decrypt_value(run.error, row=("run-error", str(run.id)))


def expired_leases(*, now: datetime.datetime | None = None):
    """Running runs whose lease ran out (their worker was lost), oldest first."""
    return Run.objects.filter(
        status=Run.Status.RUNNING, lease_until__lt=now or timezone.now()
    ).order_by("lease_until")


@dataclasses.dataclass(frozen=True)
class StalledRuns:
    expired_leases: list[uuid.UUID]
    # Each the oldest queued run of a thread nothing runs on, queued longer
    # than a lease ago: its task message was lost.
    lost_messages: list[uuid.UUID]


def stalled_runs(*, limit: int, now: datetime.datetime | None = None) -> StalledRuns:
    """Runs that no worker will execute unless they are dispatched again."""
    now = now or timezone.now()
    expired = list(expired_leases(now=now).values_list("id", flat=True)[:limit])
    stale_before = now - datetime.timedelta(
        seconds=settings.GATEHOUSE_RUN_LEASE_SECONDS
    )
    busy_threads = Run.objects.filter(status=Run.Status.RUNNING).values("thread_id")
    stalled_threads = list(
        Run.objects.filter(status=Run.Status.QUEUED)
        .exclude(thread_id__in=busy_threads)
        .values("thread_id")
        .annotate(oldest=Min("created_at"))
        .filter(oldest__lt=stale_before)
        .values_list("thread_id", flat=True)[:limit]
    )
    oldest = (
        Run.objects.filter(thread_id=thread_pk, status=Run.Status.QUEUED)
        .order_by("created_at")
        .values_list("id", flat=True)
        .first()
        for thread_pk in stalled_threads
    )
    return StalledRuns(
        expired_leases=expired, lost_messages=[run for run in oldest if run]
    )


def namespaces_over(*, thread_pks, keep: int):
    """Each namespace of these threads that holds more than `keep` checkpoints,
    as {"thread_id", "thread__thread_id", "checkpoint_ns", "rows"}: what
    pruning to the latest `keep` would shorten."""
    return (
        Checkpoint.objects.filter(thread_id__in=thread_pks)
        .values("thread_id", "thread__thread_id", "checkpoint_ns")
        .annotate(rows=Count("*"))
        .filter(rows__gt=keep)
        .order_by("thread_id", "checkpoint_ns")
    )
