"""record(): the one way anything writes to the audit trail."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.models import F

from audit import events
from audit.models import ActorType, AuditEvent, AuditSequence
from runs.models import Tenant


@dataclass(frozen=True)
class Actor:
    """Who did something, with a label that still reads after they are gone."""

    type: str
    id: str = ""
    label: str = ""

    @classmethod
    def system(cls, label: str = "system") -> Actor:
        return cls(type=ActorType.SYSTEM, id="", label=label)

    @classmethod
    def user(cls, user: Any) -> Actor:
        return cls(type=ActorType.USER, id=str(user.pk), label=user.get_username())

    @classmethod
    def api_key(cls, api_key: Any, on_behalf_of: str = "") -> Actor:
        label = f"key {api_key.prefix} ({api_key.name})"
        if on_behalf_of:
            label += f" for {on_behalf_of}"
        return cls(type=ActorType.API_KEY, id=str(api_key.pk), label=label[:200])

    @classmethod
    def agent(cls, name: str) -> Actor:
        return cls(type=ActorType.AGENT, id=name, label=f"agent {name}")


def _next_seq(tenant: Tenant) -> int:
    AuditSequence.objects.get_or_create(tenant=tenant)
    # The UPDATE takes the row lock until commit: see AuditSequence.
    AuditSequence.objects.filter(tenant=tenant).update(last_seq=F("last_seq") + 1)
    return AuditSequence.objects.values_list("last_seq", flat=True).get(tenant=tenant)


def record(
    *,
    tenant: Tenant,
    kind: events.EventKind,
    actor: Actor,
    thread_id: str = "",
    run_id: str = "",
    action: str = "",
    data: dict[str, Any] | None = None,
) -> AuditEvent:
    """Append an event to the tenant's trail inside the caller's transaction.

    Call it last in a service's transaction: the tenant's sequence row stays
    locked until that transaction commits.
    """
    declared = events.get(kind.name)
    data = data or {}
    summary = declared.summarise(**data)
    with transaction.atomic():
        return AuditEvent.objects.create(
            tenant=tenant,
            seq=_next_seq(tenant),
            actor_type=actor.type,
            actor_id=actor.id,
            actor_label=actor.label[:200],
            kind=declared.name,
            thread_id=thread_id,
            run_id=str(run_id) if run_id else "",
            action=action,
            summary=summary[:500],
            data=data,
        )
