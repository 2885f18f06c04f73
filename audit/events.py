"""Every kind of audit event, declared once, with the template of its summary.

The rule on personal data
-------------------------

The trail is kept for years, longer than the threads it describes and after
their deletion, so it must never hold what a customer or a user wrote. An
event carries identifiers (thread, run, approval and order ids), counts,
statuses, labels of actors, and digests; never message text, tool arguments or
tool results in clear. `audit.services.record()` enforces the mechanical part:

- `data` is a flat mapping of short values: None, booleans, numbers, strings
  of at most `MAX_TEXT` characters and lists of those. A plain nested mapping
  is refused, because it is how tool arguments, resume values and state leak
  in whole.
- Arguments (of a tool call, of an approval request, of an edited approval)
  go through `audit.redaction.describe(args, safe_keys)`: every value becomes
  a keyed digest (`hmac-sha256:<16 hex>`) except the keys that the agent
  declares safe to show (an order id, an amount), which stay in clear. The
  result is the one kind of nested mapping `record()` accepts.
- A summary is formatted from the event's data plus `thread_id`, `run_id`,
  `action` and `actor` (the actor's label), so it can only say what the data
  already says.

Free text that a person typed (a reviewer's note, an error message built from
input) is digested or reduced to a fact ("with a note"), never stored as is.

Declaring a kind
----------------

`NAME = _declare("noun.verb", "summary template")`. Optional keywords:
`timeline=False` for kinds that would clutter a thread's story (they are
still stored, queried and exported).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EventKind:
    name: str
    summary: str
    # Shown in a thread's compact timeline; noisy kinds (every state read)
    # opt out and are only counted there.
    timeline: bool = True

    def summarise(self, **data: object) -> str:
        try:
            return self.summary.format(**data)
        except (KeyError, IndexError) as exc:
            raise ValueError(
                f"audit event {self.name!r} needs {exc} in its data for its summary"
            ) from None


REGISTRY: dict[str, EventKind] = {}


def _declare(name: str, summary: str, *, timeline: bool = True) -> EventKind:
    if name in REGISTRY:
        raise ValueError(f"audit event kind {name!r} declared twice")
    kind = EventKind(name=name, summary=summary, timeline=timeline)
    REGISTRY[name] = kind
    return kind


def get(name: str) -> EventKind:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"undeclared audit event kind {name!r}") from None


# Tenancy and access
TENANT_CREATED = _declare("tenant.created", "tenant {slug} created")
TENANT_CHANGED = _declare(
    "tenant.changed",
    "tenant {slug} changed: {fields} (was {previous_slug}, '{previous_name}')",
)
LOGIN_LOCKED_OUT = _declare(
    "login.locked_out",
    "admin login of {username} locked out from {ip_address} after {failures} "
    "wrong passwords",
)
LOGIN_UNLOCKED = _declare(
    "login.unlocked", "admin login lockout of {username} lifted by {actor}"
)
MEMBERSHIP_CREATED = _declare("membership.created", "{username} joined as {role}")
MEMBERSHIP_CHANGED = _declare("membership.changed", "{username} is now {role}")
MEMBERSHIP_REMOVED = _declare("membership.removed", "{username} ({role}) removed")
API_KEY_CREATED = _declare(
    "api_key.created",
    "{key_kind} API key {prefix} '{name}' created with scopes {scopes}",
)
API_KEY_REVOKED = _declare("api_key.revoked", "API key {prefix} '{name}' revoked")
API_KEY_RENAMED = _declare(
    "api_key.renamed", "API key {prefix} renamed from '{previous}' to '{name}'"
)

# The trail itself
# A deleted thread's tombstone: what was removed, when and on whose request,
# never the content. Recorded through audit.services.thread_tombstone_record().
THREAD_DELETED = _declare(
    "thread.deleted",
    "thread {thread_id} deleted on request of {requested_by}; its content was "
    "destroyed",
)
AUDIT_PURGED = _declare(
    "audit.purged",
    "audit events up to #{through_seq} purged ({events} events older than {before})",
)

# Keys
MASTER_KEY_ROTATED = _declare(
    "crypto.master_key_rotated",
    "{rewrapped} thread data keys rewrapped under master key {key_id}",
)

# Threads and runs
THREAD_CREATED = _declare("thread.created", "thread created for agent {agent}")
THREAD_FORKED = _declare(
    "thread.forked",
    "checkpoint {checkpoint_id} forked from {parent_checkpoint_id} by {actor}",
)
THREAD_MIGRATED = _declare(
    "thread.migrated",
    "thread moved from {agent}@{from_version} to {agent}@{to_version} by {function} "
    "({added} key(s) added, {removed} removed, {changed} changed)",
)
STATE_READ = _declare(
    "thread.state_read", "state read at checkpoint {checkpoint_id}", timeline=False
)
# Every other read that decrypts thread content: one event per request.
THREAD_READ = _declare(
    "thread.read", "thread read with {interrupts} interrupt value(s)", timeline=False
)
RUN_READ = _declare("run.read", "errors of {runs} run(s) read", timeline=False)
# A page of several threads' states (a search under /langgraph/): one event,
# the thread ids in its data, not one per thread.
STATES_READ = _declare(
    "thread.states_read", "state of {count} thread(s) read", timeline=False
)
THREAD_CLOSED = _declare(
    "thread.closed", "thread closed after its failed run by {actor}, with a note"
)
HISTORY_READ = _declare(
    "thread.history_read", "history read: {count} checkpoint(s)", timeline=False
)
RUN_OUTPUT_READ = _declare("run.output_read", "run output read ({how})", timeline=False)
THREAD_COPIED = _declare("thread.copied", "thread copied from {source_thread_id}")
THREAD_METADATA_CHANGED = _declare(
    "thread.metadata_changed", "thread metadata changed: {keys}"
)
RUN_QUEUED = _declare("run.queued", "{kind} run queued on {agent}@{version}")
RUN_STARTED = _declare("run.started", "run started on {worker} (attempt {attempt})")
RUN_RECOVERED = _declare(
    "run.recovered", "run taken over after its worker was lost (lease of {worker})"
)
RUN_INTERRUPTED = _declare("run.interrupted", "run stopped on {count} interrupt(s)")
RUN_SUCCEEDED = _declare("run.succeeded", "run finished")
RUN_FAILED = _declare("run.failed", "run failed: {error_type}")
RUN_CANCELLED = _declare("run.cancelled", "run cancelled: {reason}")
RUN_CANCEL_REQUESTED = _declare(
    "run.cancel_requested", "cancellation ({action}) of the running run requested"
)
TOOL_CALL_STARTED = _declare("tool_call.started", "{tool} called with key {key}")
TOOL_CALL_SUCCEEDED = _declare("tool_call.succeeded", "{tool} succeeded (key {key})")
TOOL_CALL_FAILED = _declare(
    "tool_call.failed", "{tool} attempt {attempt} failed ({error_type}); {then}"
)
# Sagas (runs.compensation): a failed run undoing what it did, newest first.
RUN_COMPENSATING = _declare(
    "run.compensating", "run failed ({error_type}); undoing {steps} completed step(s)"
)
TOOL_COMPENSATED = _declare(
    "tool.compensated", "{compensated} undone by {tool} (key {key})"
)
RUN_COMPENSATED = _declare(
    "run.compensated", "{steps} completed step(s) undone; the run ends compensated"
)

# Webhooks
WEBHOOK_SUBSCRIBED = _declare(
    "webhook.subscribed",
    "webhook subscription to {target} created ({events})",
)
WEBHOOK_UNSUBSCRIBED = _declare(
    "webhook.unsubscribed", "webhook subscription to {target} deleted"
)

# Approvals
APPROVAL_REQUESTED = _declare(
    "approval.requested", "approval requested for {action} (risk {risk})"
)
APPROVAL_DECIDED = _declare(
    "approval.decided", "{action} {verdict} by {reviewer}{edit}"
)
APPROVAL_READ = _declare(
    "approval.read", "{action} request read with its payload ({how})", timeline=False
)
# The desk's queue: one event per page and tenant, the request ids in its data.
APPROVALS_READ = _declare(
    "approval.list_read",
    "payloads of {count} request(s) read in the queue",
    timeline=False,
)

# The reviewer's desk (approvals admin)
APPROVAL_REASSIGNED = _declare(
    "approval.reassigned", "{action} request assigned to {assignee} by {actor}"
)
APPROVAL_ESCALATED_MANUALLY = _declare(
    "approval.escalated_manually",
    "{action} request escalated to level {level} by {actor}",
)

# Retention: policies, legal holds, deletion requests and the scheduled jobs
RETENTION_POLICY_CHANGED = _declare(
    "retention.policy_changed", "retention policy changed: {fields}"
)
RETENTION_JOB_RAN = _declare(
    "retention.job_ran", "retention job {job} ran: {outcome}", timeline=False
)
LEGAL_HOLD_PLACED = _declare(
    "legal_hold.placed", "legal hold #{hold_id} placed on {target} by {actor}"
)
LEGAL_HOLD_LIFTED = _declare(
    "legal_hold.lifted", "legal hold #{hold_id} on {target} lifted by {actor}"
)
DELETION_REQUESTED = _declare(
    "deletion.requested",
    "deletion of {target} requested by {actor} ({threads} thread(s), {status})",
)
DELETION_COMPLETED = _declare(
    "deletion.completed",
    "deletion request {deletion_request} completed: {threads} thread(s) removed",
)
APPROVAL_ESCALATED = _declare(
    "approval.escalated",
    "{action} request unanswered: {step} (level {level}), {notified} notified",
)
APPROVAL_EXPIRED = _declare(
    "approval.expired",
    "{action} request expired unanswered: denied by the system, run resumed",
)
APPROVAL_CLOSED = _declare("approval.closed", "{action} request closed: {reason}")

# Reads of decrypted content (a state, an interrupt, a run's error or output, a
# request's payload): many per thread and routine, so the admin's event list
# can hide them with one filter.
READS = frozenset(
    kind.name
    for kind in (
        STATE_READ,
        THREAD_READ,
        RUN_READ,
        HISTORY_READ,
        RUN_OUTPUT_READ,
        APPROVAL_READ,
        STATES_READ,
        APPROVALS_READ,
    )
)
