"""A counting proxy for PostgreSQL's wire protocol: what an engine asks of Postgres.

The side-by-side benchmark points each engine at one of these (only while it
counts, since a proxy in the path costs time) to learn, per complete run:

- transactions: each time the server reports it is idle again (ReadyForQuery
  'I') after at least one command, one transaction ended; those in which a
  statement wrote (a command tag `INSERT`, `UPDATE`, `DELETE` with rows, or
  a statement that writes from a `WITH` clause) are counted apart;
- round trips: ReadyForQuery messages, one per Sync or simple Query (a
  pipeline sends several before it waits, so this is an upper bound);
- statements (command tags), by kind (`UPDATE audit_auditsequence`,
  `SAVEPOINT`, `SELECT 1`...), and connections opened.

`pg_stat_database` would be simpler but counts more than the engine's own
work: an idle backend that falls behind on the catalog invalidations that
other databases' DDL produces runs an empty transaction to catch up, and on a
machine shared with test suites that create and migrate databases all day,
those are a good part of the count. The proxy sees exactly what the engine
sent and what the server answered. (Rows are counted from
`pg_stat_user_tables`, which is exact once the engine's backends have
exited: command tags do not show rows written from a `WITH` clause.)

Encrypted connections cannot be read: connect with `sslmode=disable` and
`gssencmode=disable` (`proxied_url` adds both).
"""

from __future__ import annotations

import asyncio
import re
import struct
import threading
from collections import Counter, deque
from urllib.parse import urlsplit, urlunsplit

SSL_REQUEST, GSSENC_REQUEST, CANCEL_REQUEST = 80877103, 80877104, 80877102
WRITES = frozenset({"INSERT", "UPDATE", "DELETE", "MERGE"})
# A statement that writes inside a WITH clause answers with its last verb's tag.
_WRITES_IN_WITH = re.compile(
    r"^\s*WITH\b.*\b(INSERT\s+INTO|UPDATE\s+\S+\s+SET|DELETE\s+FROM)\b",
    re.IGNORECASE | re.DOTALL,
)


def proxied_url(url: str, port: int) -> str:
    """`url` through the proxy on `port`: same database, user and options."""
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)
    user = f"{netloc[0]}@" if len(netloc) == 2 else ""
    query = "&".join(
        filter(None, [parts.query, "sslmode=disable", "gssencmode=disable"])
    )
    return urlunsplit(parts._replace(netloc=f"{user}127.0.0.1:{port}", query=query))


_TABLE = r'"?(\w+)"?(?:\."?(\w+)"?)?'
_KINDS = [
    (re.compile(r"^\s*SELECT\s+1\s*$", re.IGNORECASE), None),
    (
        re.compile(rf"^\s*WITH\b.*?\bINSERT\s+INTO\s+{_TABLE}", re.I | re.S),
        "WITH…INSERT",
    ),
    (re.compile(rf"^\s*INSERT\s+INTO\s+{_TABLE}", re.I), "INSERT"),
    (re.compile(rf"^\s*UPDATE\s+{_TABLE}", re.I), "UPDATE"),
    (re.compile(rf"^\s*DELETE\s+FROM\s+{_TABLE}", re.I), "DELETE"),
    (re.compile(rf"^\s*SELECT\b.*?\bFROM\s+{_TABLE}", re.I | re.S), "SELECT"),
]


def statement_kind(tag: str, sql: str) -> str:
    """`SAVEPOINT`, `SELECT 1`, `UPDATE audit_auditsequence`: what a statement was."""
    for pattern, verb in _KINDS:
        match = pattern.match(sql)
        if match:
            if verb is None:
                return "SELECT 1"
            schema, table = match.groups()[-2:]
            return f"{verb} {f'{schema}.{table}' if table else schema}"
    return tag.split(" ", 1)[0]


class Tally:
    """The counts of one proxy, shared by its connections."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: Counter = Counter()

    def snapshot(self) -> Counter:
        with self.lock:
            return Counter(self.counts)


class _Connection:
    """Protocol state of one client connection, as the proxy relays it."""

    def __init__(self, tally: Tally) -> None:
        self.tally = tally
        self.statements: dict[bytes, str] = {}
        self.portals: dict[bytes, str] = {}
        self.executed: deque[str] = deque()
        self.commands = 0
        self.wrote = False

    # client -> server
    def client_message(self, kind: bytes, body: bytes) -> None:
        if kind == b"P":
            name, rest = body.split(b"\0", 1)
            self.statements[name] = rest.split(b"\0", 1)[0].decode("utf-8", "replace")
        elif kind == b"B":
            portal, statement, _ = body.split(b"\0", 2)
            self.portals[portal] = self.statements.get(statement, "")
        elif kind == b"E":
            self.executed.append(self.portals.get(body.split(b"\0", 1)[0], ""))
        elif kind == b"Q":
            sql = body.split(b"\0", 1)[0].decode("utf-8", "replace")
            self.executed.extend(part for part in sql.split(";") if part.strip())

    # server -> client
    def server_message(self, kind: bytes, body: bytes) -> None:
        if kind == b"C":
            tag = body.split(b"\0", 1)[0].decode()
            sql = self.executed.popleft() if self.executed else ""
            verb = tag.split(" ", 1)[0]
            self.commands += 1
            if verb in WRITES:
                self.wrote = self.wrote or tag.rsplit(" ", 1)[1] != "0"
            elif verb == "SELECT" and _WRITES_IN_WITH.match(sql):
                self.wrote = True
            with self.tally.lock:
                self.tally.counts["statements"] += 1
                self.tally.counts[f"statement:{statement_kind(tag, sql)}"] += 1
                if verb == "ROLLBACK":
                    self.tally.counts["rollbacks"] += 1
        elif kind == b"I":  # EmptyQueryResponse
            if self.executed:
                self.executed.popleft()
        elif kind == b"Z":
            status = body[:1]
            with self.tally.lock:
                self.tally.counts["round_trips"] += 1
                if status == b"I" and self.commands:
                    self.tally.counts["transactions"] += 1
                    if self.wrote:
                        self.tally.counts["write_transactions"] += 1
            if status == b"I":
                self.commands, self.wrote = 0, False
            self.executed.clear()  # after an error the server skipped the rest


async def _relay_typed(reader, writer, on_message) -> None:
    while True:
        header = await reader.readexactly(5)
        kind, length = header[:1], struct.unpack("!I", header[1:])[0]
        body = await reader.readexactly(length - 4)
        on_message(kind, body)
        writer.write(header + body)
        await writer.drain()


async def _pipe(reader, writer) -> None:
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()


class CountingProxy:
    """Listens on 127.0.0.1 (a free port) and relays to one PostgreSQL server."""

    def __init__(self, server_host: str = "127.0.0.1", server_port: int = 5432):
        self.server = (server_host, server_port)
        self.tally = Tally()
        self.loop = asyncio.new_event_loop()
        self.writers: set[asyncio.StreamWriter] = set()
        self.port = 0
        started = threading.Event()
        self.thread = threading.Thread(
            target=self._serve, args=(started,), daemon=True, name="pgcount"
        )
        self.thread.start()
        started.wait()

    def _serve(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.listener = self.loop.run_until_complete(
            asyncio.start_server(self._client, "127.0.0.1", 0)
        )
        self.port = self.listener.sockets[0].getsockname()[1]
        started.set()
        self.loop.run_forever()

    async def _client(self, client_reader, client_writer) -> None:
        server_reader, server_writer = await asyncio.open_connection(*self.server)
        self.writers.update((client_writer, server_writer))
        state = _Connection(self.tally)
        try:
            # Untyped start: [length][code...]; SSL/GSS requests are declined
            # by the server ('N') when the client asked with sslmode=disable.
            while True:
                length = struct.unpack("!I", await client_reader.readexactly(4))[0]
                body = await client_reader.readexactly(length - 4)
                server_writer.write(struct.pack("!I", length) + body)
                await server_writer.drain()
                code = struct.unpack("!I", body[:4])[0]
                if code == CANCEL_REQUEST:
                    await _pipe(server_reader, client_writer)
                    return
                if code not in (SSL_REQUEST, GSSENC_REQUEST):
                    break
                answer = await server_reader.readexactly(1)
                if answer != b"N":
                    raise RuntimeError("encrypted connection: cannot count it")
                client_writer.write(answer)
                await client_writer.drain()
            with self.tally.lock:
                self.tally.counts["connections"] += 1
            relays = [
                asyncio.ensure_future(relay)
                for relay in (
                    _relay_typed(client_reader, server_writer, state.client_message),
                    _relay_typed(server_reader, client_writer, state.server_message),
                )
            ]
            # Either side closing ends the connection.
            await asyncio.wait(relays, return_when=asyncio.FIRST_COMPLETED)
            for relay in relays:
                relay.cancel()
            await asyncio.gather(*relays, return_exceptions=True)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            for writer in (client_writer, server_writer):
                writer.close()
                self.writers.discard(writer)

    async def _shut(self) -> None:
        """Close every connection still open: their backends end with them."""
        self.listener.close()
        for writer in list(self.writers):
            writer.close()
        current = asyncio.current_task()
        pending = [task for task in asyncio.all_tasks() if task is not current]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._shut(), self.loop).result(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
