"""CSV and JSON Lines exports that stream in constant memory, whatever the size.

Rows come from a server-side cursor (`QuerySet.iterator`) a chunk at a time
and leave as text in blocks of about 64 kB, so memory depends on the chunk
size, never on the number of events. The cursor lives in a transaction opened
by the generator itself: outside one, Postgres would materialise a holdable
cursor's whole result before sending the first row. `ExportResponse` keeps it
so under the ASGI server as well.
"""

from __future__ import annotations

import csv
import datetime
import io
from collections.abc import Iterator
from json.encoder import encode_basestring as _quote

from asgiref.sync import sync_to_async
from django.db import transaction
from django.db.models import QuerySet
from django.http import StreamingHttpResponse

from audit.expressions import json_text, timestamp_text
from audit.models import AuditEvent

CHUNK_ROWS = 2000
FLUSH_BYTES = 64 * 1024
COLUMNS = (
    "seq",
    "occurred_at",
    "kind",
    "actor_type",
    "actor_id",
    "actor_label",
    "actor_on_behalf_of",
    "thread_id",
    "run_id",
    "action",
    "summary",
    "data",
)
CONTENT_TYPES = {
    "csv": "text/csv; charset=utf-8",
    "jsonl": "application/x-ndjson; charset=utf-8",
}
# A spreadsheet runs a cell that starts with one of these as a formula.
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def iso(value: datetime.datetime | str) -> str:
    """The API's timestamp form (DRF's): ISO 8601 in UTC with a Z."""
    if isinstance(value, str):  # formatted by the database already
        return value.replace(".000000Z", "Z")
    text = value.astimezone(datetime.UTC).isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def _rows(queryset: QuerySet[AuditEvent]) -> Iterator[tuple]:
    """Rows of COLUMNS, with `data` as JSON text (never decoded and re-encoded)
    and, on Postgres, `occurred_at` as text."""
    rows = queryset.annotate(
        _when=timestamp_text("occurred_at"), _data=json_text("data")
    ).values_list("seq", "_when", *COLUMNS[2:-1], "_data")
    with transaction.atomic():
        yield from rows.iterator(chunk_size=CHUNK_ROWS)


def defuse(value: str) -> str:
    """A text cell a spreadsheet will not run as a formula (see csv_chunks);
    the approvals queue's export uses it too."""
    return "'" + value if value.startswith(_FORMULA_STARTS) else value


def csv_chunks(queryset: QuerySet[AuditEvent]) -> Iterator[str]:
    """A header line, then one line per event; `data` as JSON text.

    Text cells that a spreadsheet would run as a formula are prefixed with a
    single quote (OWASP's advice on CSV injection): a key's name or a label
    is chosen by someone, and the file is opened by an auditor.
    """
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(COLUMNS)
    for seq, occurred_at, *texts, data in _rows(queryset):
        writer.writerow([seq, iso(occurred_at), *map(defuse, texts), data])
        if buffer.tell() >= FLUSH_BYTES:
            yield buffer.getvalue()
            buffer.seek(0)
            buffer.truncate()
    yield buffer.getvalue()


_JSONL_LINE = (
    '{{"seq":{},"occurred_at":"{}","kind":{},"actor":{{"type":{},"id":{},'
    '"label":{},"on_behalf_of":{}}},"thread_id":{},"run_id":{},"action":{},'
    '"summary":{},"data":{}}}\n'
)


def jsonl_chunks(queryset: QuerySet[AuditEvent]) -> Iterator[str]:
    """One JSON object per line, each shaped as in the events API."""
    parts: list[str] = []
    size = 0
    for seq, occurred_at, *texts, data in _rows(queryset):
        line = _JSONL_LINE.format(seq, iso(occurred_at), *map(_quote, texts), data)
        parts.append(line)
        size += len(line)
        if size >= FLUSH_BYTES:
            yield "".join(parts)
            parts, size = [], 0
    yield "".join(parts)


EXPORTERS = {"csv": csv_chunks, "jsonl": jsonl_chunks}


class ExportResponse(StreamingHttpResponse):
    """A response that streams an exporter's blocks under WSGI and ASGI alike.

    Under ASGI, Django serves a synchronous iterator by reading it whole into
    a list first, which would hold an entire export in memory. This response
    pulls one block at a time instead, on the thread that ran the view
    (`thread_sensitive`: the request's own thread), so the generator's cursor
    and transaction stay on their connection; and it closes the generator on
    that thread when the client goes away mid-download.
    """

    def __init__(self, chunks: Iterator[str], **kwargs) -> None:
        super().__init__(chunks, **kwargs)
        self._chunks = chunks

    async def __aiter__(self):
        parts = self.streaming_content
        next_part = sync_to_async(next, thread_sensitive=True)
        try:
            while (part := await next_part(parts, None)) is not None:
                yield part
        finally:
            await sync_to_async(self._chunks.close, thread_sensitive=True)()
