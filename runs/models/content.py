"""How a model declares the thread content it stores, so that removing a thread
clears it whichever app the model belongs to.

A model sets `thread_content = (ThreadContent(...), ...)`; `runs.storage`
finds every installed model that does through the app registry (runs imports
none of the apps above it), clears or deletes what they hold for the threads
being removed, and reports the rows by each declaration's name.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ThreadContent:
    # What the removal counts call these rows ("tool_results").
    name: str
    # The ciphertext columns, set to `empty` on removal; none: the rows
    # themselves are the content and are deleted.
    fields: tuple[str, ...] = ()
    empty: bytes | None = None
    # The lookup path from the model to its Thread.
    thread: str = "thread"
