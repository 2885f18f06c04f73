"""The runs app's use cases: every state change, each in one transaction with
its audit event. Split by subject; import from here."""

from runs.services.runs import (
    run_cancel_active,
    run_errors_read,
    run_resume,
    run_retry,
    run_start,
    thread_close,
)
from runs.services.tenancy import (
    IssuedApiKey,
    api_key_create,
    api_key_rename,
    api_key_revoke,
    login_lockout_lift,
    login_lockout_record,
    membership_remove,
    membership_set,
    parse_scopes,
    reviewer_create,
    tenant_create,
    tenant_update,
)
from runs.services.threads import (
    thread_create,
    thread_fork,
    thread_interrupts_read,
    thread_state,
)

__all__ = [
    "IssuedApiKey",
    "api_key_create",
    "api_key_rename",
    "api_key_revoke",
    "login_lockout_lift",
    "login_lockout_record",
    "membership_remove",
    "membership_set",
    "parse_scopes",
    "reviewer_create",
    "run_cancel_active",
    "run_errors_read",
    "run_resume",
    "run_retry",
    "run_start",
    "tenant_create",
    "tenant_update",
    "thread_close",
    "thread_create",
    "thread_fork",
    "thread_interrupts_read",
    "thread_state",
]
