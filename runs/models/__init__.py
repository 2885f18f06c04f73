from runs.models.checkpoints import ChannelBlob, Checkpoint, PendingWrite
from runs.models.tenancy import (
    ApiKey,
    IdempotencyRecord,
    Membership,
    Role,
    Scope,
    Tenant,
    TenantOwnedQuerySet,
)
from runs.models.threads import Thread, ThreadQuerySet

__all__ = [
    "ApiKey",
    "ChannelBlob",
    "Checkpoint",
    "IdempotencyRecord",
    "Membership",
    "PendingWrite",
    "Role",
    "Scope",
    "Tenant",
    "TenantOwnedQuerySet",
    "Thread",
    "ThreadQuerySet",
]
