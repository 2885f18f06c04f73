from runs.models.checkpoints import ChannelBlob, Checkpoint, PendingWrite
from runs.models.content import ThreadContent, WrappedKey
from runs.models.execution import LEASE_HELD_SQL, LeaseLost, Run
from runs.models.replay import RecordedValue
from runs.models.streaming import RunStreamEvent
from runs.models.tenancy import (
    ApiKey,
    IdempotencyRecord,
    KeyCacheStore,
    Membership,
    Role,
    Scope,
    Tenant,
    TenantOwnedQuerySet,
)
from runs.models.threads import Thread, ThreadQuerySet
from runs.models.tools import ToolCall

__all__ = [
    "ApiKey",
    "ChannelBlob",
    "Checkpoint",
    "IdempotencyRecord",
    "KeyCacheStore",
    "LEASE_HELD_SQL",
    "LeaseLost",
    "Membership",
    "PendingWrite",
    "RecordedValue",
    "Role",
    "Run",
    "RunStreamEvent",
    "Scope",
    "Tenant",
    "TenantOwnedQuerySet",
    "Thread",
    "ThreadContent",
    "WrappedKey",
    "ThreadQuerySet",
    "ToolCall",
]
