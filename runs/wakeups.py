"""What a commit wakes goes out before the rest of its on-commit work.

A transaction that queues a run (a start, a decision's resume) or ends one
also records audit events, and each announces itself once the transaction
commits (audit.services): the webhook receivers then look up the tenant's
subscriptions, one query per commit, more for a run with a webhook of its
own. A worker waiting for the run's task, or a client waiting for the run's
end on its stream, should not wait for those.

`on_commit` registers a callback as `transaction.on_commit` does (so
savepoints, rollbacks and Django's captureOnCommitCallbacks treat it as any
other), marked as a wake-up; when a transaction commits, the Postgres
backend (config.postgresql) runs its wake-ups first, each group in the order
it was registered in (`woken_first`). On another database the callbacks run
in registration order: correct, only without the head start. A wake-up is
robust, as the announcements are: an unexpected failure is logged and the
callbacks after it still run (a send that finds the broker down is handled
in runs.dispatch).
"""

from __future__ import annotations

from collections.abc import Callable

from django.db import transaction


class _WakeUp:
    """A callback marked as a wake-up, named as Django's robust log names it."""

    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback = callback
        self.__qualname__ = getattr(callback, "__qualname__", repr(callback))

    def __call__(self) -> None:
        self.callback()


def on_commit(callback: Callable[[], None], using: str | None = None) -> None:
    """`callback` once the current transaction commits, ahead of the
    callbacks that are not wake-ups; at once outside a transaction."""
    transaction.on_commit(_WakeUp(callback), using=using, robust=True)


def woken_first(pending: list[tuple]) -> None:
    """Order a connection's pending commit callbacks (Django's
    `run_on_commit`: savepoint ids, callback, robust) for running: the
    wake-ups first; a stable sort keeps each group's order."""
    pending.sort(key=lambda entry: not isinstance(entry[1], _WakeUp))
