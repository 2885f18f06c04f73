"""CSV and JSON Lines exports stream in bounded memory and parse back."""

import csv
import datetime
import io
import json
import tracemalloc

import pytest
from asgiref.sync import async_to_sync
from django.http import StreamingHttpResponse

from audit import events, export
from audit.services import Actor, record
from tests.audit.helpers import BASE_TIME, add_events, event_fields
from tests.factories import tenant_with_client

pytestmark = pytest.mark.django_db
EVENTS = "/api/v1/audit/events"
BIG = 100_000
# Far below the size of the export itself (about 30 MB of text for 100k
# events), so a response that buffered the whole export would fail.
MEMORY_BOUND = 8 * 1024 * 1024


def expected_row(seq: int) -> dict:
    fields = event_fields(seq)
    return {
        "seq": seq,
        "occurred_at": (BASE_TIME + datetime.timedelta(seconds=seq))
        .isoformat()
        .replace("+00:00", "Z"),
        "kind": fields["kind"],
        "actor": {
            "type": fields["actor_type"],
            "id": fields["actor_id"],
            "label": fields["actor_label"],
            "on_behalf_of": fields["actor_on_behalf_of"],
        },
        "thread_id": fields["thread_id"],
        "run_id": fields["run_id"],
        "action": fields["action"],
        "summary": fields["summary"],
        "data": fields["data"],
    }


def csv_to_document(row: dict) -> dict:
    return {
        "seq": int(row["seq"]),
        "occurred_at": row["occurred_at"],
        "kind": row["kind"],
        "actor": {
            "type": row["actor_type"],
            "id": row["actor_id"],
            "label": row["actor_label"],
            "on_behalf_of": row["actor_on_behalf_of"],
        },
        "thread_id": row["thread_id"],
        "run_id": row["run_id"],
        "action": row["action"],
        "summary": row["summary"],
        "data": json.loads(row["data"]),
    }


def lines(chunks):
    """Text lines from a stream of byte chunks, holding one chunk at a time."""
    pending = ""
    for chunk in chunks:
        pending += chunk.decode()
        *complete, pending = pending.split("\n")
        yield from complete
    if pending:
        yield pending


def parse(export_format: str, chunks):
    if export_format == "jsonl":
        for line in lines(chunks):
            yield json.loads(line)
    else:
        # csv.reader takes an iterator of lines; quoted newlines would span
        # lines, and the test data has none.
        yield from map(csv_to_document, csv.DictReader(lines(chunks)))


@pytest.mark.parametrize("export_format", ["csv", "jsonl"])
def test_export_of_100k_events_streams_in_bounded_memory_and_parses_back(
    export_format,
):
    tenant, client = tenant_with_client(scopes=["audit"])
    first = add_events(tenant, BIG)[0]
    # The bulk events are the agent's; the tenant's own setup events are not.
    response = client.get(EVENTS, {"format": export_format, "actor": "agent"})
    assert response.status_code == 200
    assert isinstance(response, StreamingHttpResponse)
    assert response["Content-Type"].startswith(
        {"csv": "text/csv", "jsonl": "application/x-ndjson"}[export_format]
    )
    assert "attachment" in response["Content-Disposition"]

    tracemalloc.start()
    try:
        count = 0
        for count, document in enumerate(parse(export_format, response), start=1):
            assert document == expected_row(first + count - 1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        # A stream dropped half-read would close its cursor whenever the
        # garbage collector ran, possibly in the middle of another query.
        response.close()
    assert count == BIG
    assert peak < MEMORY_BOUND, f"peak {peak / 1e6:.1f} MB"


def test_accept_header_selects_the_export():
    tenant, client = tenant_with_client(scopes=["audit"])
    add_events(tenant, 3)
    response = client.get(EVENTS, HTTP_ACCEPT="text/csv")
    assert isinstance(response, StreamingHttpResponse)
    rows = list(csv.DictReader(io.StringIO(b"".join(response).decode())))
    assert [int(row["seq"]) for row in rows] == [1, 2, 3, 4, 5]
    response = client.get(EVENTS, HTTP_ACCEPT="application/x-ndjson")
    assert len(b"".join(response).splitlines()) == 5


def test_format_parameter_wins_over_a_json_accept_header():
    _, client = tenant_with_client(scopes=["audit"])
    response = client.get(EVENTS, {"format": "csv"}, HTTP_ACCEPT="application/json")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")


def test_export_applies_the_filters():
    tenant, client = tenant_with_client(scopes=["audit"])
    add_events(tenant, 200)
    response = client.get(EVENTS, {"format": "jsonl", "thread_id": "case-5"})
    seqs = [json.loads(line)["seq"] for line in b"".join(response).splitlines()]
    assert seqs == [seq for seq in range(3, 203) if seq % 97 == 5]


def test_csv_cells_that_a_spreadsheet_would_run_are_defused():
    tenant, client = tenant_with_client(scopes=["audit"])
    record(
        tenant=tenant,
        kind=events.TENANT_CREATED,
        actor=Actor.system('=HYPERLINK("http://evil")'),
        data={"slug": "x"},
    )
    rows = list(
        csv.DictReader(
            io.StringIO(b"".join(client.get(EVENTS, {"format": "csv"})).decode())
        )
    )
    assert rows[-1]["actor_label"] == '\'=HYPERLINK("http://evil")'


def test_export_streams_block_by_block_under_asgi():
    """Under ASGI Django would read a sync iterator whole before sending it;
    the export hands over each block as soon as it is made."""
    made = []

    def blocks():
        for number in range(3):
            made.append(number)
            yield f"block {number}\n"

    async def first_block_and_count():
        parts = aiter(export.ExportResponse(blocks(), content_type="text/csv"))
        first = await anext(parts)
        count = len(made)
        await parts.aclose()
        return first, count

    assert async_to_sync(first_block_and_count)() == (b"block 0\n", 1)


def test_export_under_asgi_reads_on_the_connection_of_the_request():
    """Blocks are pulled on the request's thread, whose connection holds the
    export's transaction (here, the test's own: its rows are visible only on
    it)."""
    tenant, client = tenant_with_client(scopes=["audit"])
    add_events(tenant, 3)
    response = client.get(EVENTS, {"format": "csv"})

    async def read_all():
        return b"".join([part async for part in response])

    rows = list(csv.DictReader(io.StringIO(async_to_sync(read_all)().decode())))
    assert [int(row["seq"]) for row in rows] == [1, 2, 3, 4, 5]
