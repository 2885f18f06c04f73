"""Every kind of audit event, declared once, with the template of its summary.

A summary is formatted from the event's structured data; it must never carry
personal data, only identifiers, counts and labels that are safe to keep for
as long as the audit trail is kept.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class EventKind:
    name: str
    summary: str

    def summarise(self, **data: object) -> str:
        try:
            return self.summary.format(**data)
        except (KeyError, IndexError) as exc:
            raise ValueError(
                f"audit event {self.name!r} needs {exc} in its data for its summary"
            ) from None


REGISTRY: dict[str, EventKind] = {}


def _declare(name: str, summary: str) -> EventKind:
    if name in REGISTRY:
        raise ValueError(f"audit event kind {name!r} declared twice")
    kind = EventKind(name=name, summary=summary)
    REGISTRY[name] = kind
    return kind


def get(name: str) -> EventKind:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"undeclared audit event kind {name!r}") from None


# Tenancy and access
TENANT_CREATED = _declare("tenant.created", "tenant {slug} created")
MEMBERSHIP_CREATED = _declare("membership.created", "{username} joined as {role}")
MEMBERSHIP_CHANGED = _declare("membership.changed", "{username} is now {role}")
MEMBERSHIP_REMOVED = _declare("membership.removed", "{username} ({role}) removed")
API_KEY_CREATED = _declare(
    "api_key.created", "API key {prefix} '{name}' created with scopes {scopes}"
)
API_KEY_REVOKED = _declare("api_key.revoked", "API key {prefix} '{name}' revoked")

# Keys
MASTER_KEY_ROTATED = _declare(
    "crypto.master_key_rotated",
    "{rewrapped} thread data keys rewrapped under master key {key_id}",
)
