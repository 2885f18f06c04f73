"""A checkpoint's `ts` as the saver stores it: its distance from its id's time.

LangGraph stamps a checkpoint (`ts`, `datetime.now(timezone.utc).isoformat()`)
a few microseconds before it draws the checkpoint's id, a UUIDv6 whose first
60 bits are the time in 100 ns. Stored as text, the stamp took about 21
bytes of a chat step's compressed checkpoint (133 -> 112 bytes, measured on
the benchmark's 200-step chat); stored as microseconds from the id's time, a
small int (negative when the stamp comes first, as in a step's checkpoint;
LangGraph's first, empty checkpoint draws its id first), it takes one or
two. The id is in the ciphertext's associated data, so the stamp stays as
authenticated as it was.

Only a stamp this form gives back exactly is stored so: a str in the form
`isoformat()` writes for UTC, under a UUIDv6 id in its canonical text. Any
other `ts` is stored as given. The int form is told by its type: LangGraph's
`ts` is a str (an int given as `ts` is refused at the write rather than read
back as text). Checkpoints written before (2026-12-06) hold the text, and read
as before; code before this reads the int as the stamp: during a rolling upgrade
from it the form is not written (settings.GATEHOUSE_WRITE_FORMAT;
docs/operations.md, Upgrading).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

# 100 ns intervals from the UUID epoch (1582-10-15) to the Unix epoch.
_UUID_EPOCH_TICKS = 0x01B21DD213814000
_UNIX_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def _id_time(checkpoint_id: str) -> int | None:
    """The time in a UUIDv6 id, in microseconds since 1970; None for any other id."""
    try:
        value = uuid.UUID(checkpoint_id)
    except (ValueError, TypeError, AttributeError):
        return None
    if value.version != 6 or str(value) != checkpoint_id:
        return None
    ticks = ((value.int >> 80) << 12) | ((value.int >> 64) & 0xFFF)
    return (ticks - _UUID_EPOCH_TICKS) // 10


def stored_ts(ts: Any, checkpoint_id: str, *, relative: bool = True) -> Any:
    """`ts` as stored in the checkpoint's ciphertext (see the module); as
    given when not `relative` (the earlier format)."""
    if isinstance(ts, int):
        raise TypeError(f"a checkpoint's ts is a str, not {type(ts).__name__}")
    base = _id_time(checkpoint_id) if relative and isinstance(ts, str) else None
    if base is None:
        return ts
    try:
        moment = datetime.fromisoformat(ts)
        micros = (moment - _UNIX_EPOCH) // _MICROSECOND
    except (ValueError, TypeError):  # not ISO 8601; naive
        return ts
    if (_UNIX_EPOCH + micros * _MICROSECOND).isoformat() != ts:
        return ts
    return micros - base


def read_ts(stored: Any, checkpoint_id: str) -> Any:
    """The `ts` that `stored_ts` stored."""
    if not isinstance(stored, int):
        return stored
    base = _id_time(checkpoint_id)
    if base is None:
        # Only written under a UUIDv6 id, which the associated data binds.
        raise ValueError(f"checkpoint {checkpoint_id} has a ts relative to no time")
    return (_UNIX_EPOCH + (base + stored) * _MICROSECOND).isoformat()
