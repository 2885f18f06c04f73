"""How a model declares the thread content it stores, so that removing a thread
clears it whichever app the model belongs to.

A model sets `thread_content = (ThreadContent(...), ...)`; `runs.storage`
finds every installed model that does through the app registry (runs imports
none of the apps above it), clears or deletes what they hold for the threads
being removed, and reports the rows by each declaration's name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ThreadContent:
    # What the removal counts call these rows ("tool_results").
    name: str
    # The ciphertext columns, set to `empty` on removal; none: the rows
    # themselves are the content and are deleted.
    fields: tuple[str, ...] = ()
    empty: bytes | str | None = None
    # The lookup path from the model to its Thread.
    thread: str = "thread"


@dataclass(frozen=True)
class WrappedKey:
    """A key a model stores wrapped by the master key ring, as a thread's data
    key is: `manage.py rotate_master_key` rewraps it too
    (runs.storage.data_keys_rotate), so no key is left under a master key
    about to leave the ring. A model sets `wrapped_keys = (WrappedKey(...),)`."""

    # The columns of the wrapped key, of the id of the master key that wraps
    # it, and of the tenant it is bound to; `owner` names the kind of row in
    # the wrap's associated data, with the row's primary key
    # (runs.crypto.KeyOwner), so the key unwraps in no other row.
    wrapped: str
    key_id: str
    owner: str
    tenant: str = "tenant_id"

    def owner_of(self, row: Any) -> tuple[str, int | str]:
        """The wrap's owner for `row` (runs.crypto.KeyOwner): a UUID as text."""
        return (self.owner, row.pk if isinstance(row.pk, int) else str(row.pk))
