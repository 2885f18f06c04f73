from runs.models.tenancy import (
    ApiKey,
    IdempotencyRecord,
    Membership,
    Role,
    Scope,
    Tenant,
    TenantOwnedQuerySet,
)

__all__ = [
    "ApiKey",
    "IdempotencyRecord",
    "Membership",
    "Role",
    "Scope",
    "Tenant",
    "TenantOwnedQuerySet",
]
