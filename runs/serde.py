"""Strict serialisation of everything Gatehouse stores encrypted.

LangGraph's `JsonPlusSerializer` with pickle off, JSON constructors off and its
strict msgpack mode: a msgpack extension type is rebuilt only when it is in
LangGraph's own safe list (datetimes, UUIDs, langchain-core messages,
`Interrupt`, `Send`, `Command`, ...) or in the allow-list given here.

LangGraph's strict mode, on meeting a type outside the list, logs a warning and
hands back the raw fields instead of the object; here that raises
`DisallowedType`, so a checkpoint never quietly loads as something else.

Encoded form (the plaintext that `runs.crypto` encrypts): one byte naming the
serde type (`null`, `bytes`, `bytearray`, `msgpack`), then its bytes.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from contextvars import ContextVar
from typing import Any

from langgraph.checkpoint.serde.event_hooks import (
    SerdeEvent,
    register_serde_event_listener,
)
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer


class DisallowedType(ValueError):
    """A stored value names a type that may not be rebuilt on load."""


class UnknownEncoding(ValueError):
    """A stored value's serde type is not one this serializer reads."""


TYPE_CODES = {"null": 0, "bytes": 1, "bytearray": 2, "msgpack": 3}
TYPES_BY_CODE = {code: name for name, code in TYPE_CODES.items()}

_BLOCKED_KINDS = {"msgpack_blocked", "msgpack_method_blocked"}
# The blocked-type events of the load in progress on this thread or task.
_blocked_events: ContextVar[list[SerdeEvent] | None] = ContextVar(
    "gatehouse_blocked_serde_events", default=None
)
_listener_lock = threading.Lock()
_listener_registered = False


def _collect_blocked(event: SerdeEvent) -> None:
    sink = _blocked_events.get()
    if sink is not None and event["kind"] in _BLOCKED_KINDS:
        sink.append(event)


def _ensure_listener() -> None:
    # Registered on first use rather than at import: no work at import time.
    global _listener_registered
    if _listener_registered:
        return
    with _listener_lock:
        if not _listener_registered:
            register_serde_event_listener(_collect_blocked)
            _listener_registered = True


class StrictSerializer:
    """A LangGraph `SerializerProtocol` that refuses pickle and unlisted types."""

    def __init__(self, allowed_types: Iterable[tuple[str, ...] | type] = ()) -> None:
        allowed = tuple(allowed_types)
        self.allowed_types = allowed
        self._inner = JsonPlusSerializer(
            pickle_fallback=False,
            allowed_json_modules=None,
            # None: LangGraph's safe list only; a tuple adds to it.
            allowed_msgpack_modules=allowed or None,
        )
        _ensure_listener()

    def with_allowlist(
        self, extra: Iterable[tuple[str, ...] | type]
    ) -> StrictSerializer:
        extra = tuple(extra)
        if not extra:
            return self
        return StrictSerializer((*self.allowed_types, *extra))

    # SerializerProtocol

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        return self._inner.dumps_typed(obj)

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        type_, payload = data
        if type_ not in TYPE_CODES:
            raise UnknownEncoding(
                f"refusing to load a value of serde type {type_!r}: only "
                f"{', '.join(TYPE_CODES)} are read (no pickle, no JSON constructors)"
            )
        events: list[SerdeEvent] = []
        token = _blocked_events.set(events)
        try:
            value = self._inner.loads_typed((type_, payload))
        finally:
            _blocked_events.reset(token)
        if events:
            names = sorted(
                {
                    ".".join(filter(None, (e["module"], e["name"], e.get("method"))))
                    for e in events
                }
            )
            raise DisallowedType(
                f"refusing to load {', '.join(names)}: not in the msgpack "
                "allow-list; pass it in DjangoSaver(allowed_types=...) if the "
                "agent's state really holds it"
            )
        return value

    # One-byte-tagged bytes, the plaintext runs.crypto encrypts.

    def dumps(self, obj: Any) -> bytes:
        type_, payload = self.dumps_typed(obj)
        return bytes((TYPE_CODES[type_],)) + payload

    def loads(self, data: bytes) -> Any:
        if not data:
            raise UnknownEncoding("empty value: no serde type byte")
        type_ = TYPES_BY_CODE.get(data[0])
        if type_ is None:
            raise UnknownEncoding(f"unknown serde type byte 0x{data[0]:02x}")
        return self.loads_typed((type_, data[1:]))


_default: StrictSerializer | None = None


def default_serializer() -> StrictSerializer:
    """The shared serializer with LangGraph's safe list and nothing more."""
    global _default
    if _default is None:
        _default = StrictSerializer()
    return _default
