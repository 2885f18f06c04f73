"""config.asgi's handler: each request's middleware and view run on one
thread, entered once, and that thread serves the next request once the
request's sync code is done. Driven in-process through the ASGI
interface, as uvicorn calls it (the server itself: test_server.py)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from asgiref.sync import async_to_sync
from django.core.handlers.exception import convert_exception_to_response
from django.core.signals import request_finished, request_started
from django.db import connection, transaction
from django.http import HttpResponse, StreamingHttpResponse

from config.asgi import OneHopASGIHandler, RequestThread
from runs.models import Tenant
from tests.factories import make_api_key, make_tenant

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def connections_end_with_their_request(monkeypatch):
    """As in the web process (a pool, CONN_MAX_AGE 0): the requests' threads
    hold no connection once answered, so the test database can be dropped."""
    from django.db import connections

    monkeypatch.setitem(connections.settings["default"], "CONN_MAX_AGE", 0)


def scope(path: str, headers: dict[str, str] | None = None) -> dict:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "https",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"testserver"),
            *((k.lower().encode(), v.encode()) for k, v in (headers or {}).items()),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 443),
    }


async def call(app, path: str, headers=None, *, leave_after: float | None = None):
    """The response's status and body; with `leave_after`, the client
    disconnects that many seconds after sending its request."""
    sent = []
    asked = asyncio.Event()

    async def receive():
        if not asked.is_set():
            asked.set()
            return {"type": "http.request", "body": b"", "more_body": False}
        if leave_after is None:
            await asyncio.Event().wait()  # a client that stays until answered
        await asyncio.sleep(leave_after)
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    await app(scope(path, headers), receive, send)
    status = next(
        (m["status"] for m in sent if m["type"] == "http.response.start"), None
    )
    body = b"".join(
        m.get("body", b"") for m in sent if m["type"] == "http.response.body"
    )
    return status, body


class Recording(OneHopASGIHandler):
    """Notes the thread each request's middleware chain ran on, and how many
    times per request it was entered from the event loop."""

    def __init__(self, delay: float = 0.0) -> None:
        super().__init__()
        self.delay = delay
        self.threads: list[int] = []
        self.finished = threading.Event()

    def get_response(self, request):
        self.threads.append(threading.get_ident())
        time.sleep(self.delay)
        try:
            return super().get_response(request)
        finally:
            self.finished.set()


def test_the_middleware_chain_and_the_view_run_on_one_thread_per_request():
    app = Recording()
    _, secret = make_api_key(make_tenant())

    async def three():
        return [
            await call(app, "/api/v1/agents", {"Authorization": f"Bearer {secret}"})
            for _ in range(3)
        ]

    answers = async_to_sync(three)()
    assert [status for status, _ in answers] == [200, 200, 200]
    assert all(b'"refund"' in body for _, body in answers)
    # Not Django's async chain: no coroutine between the middleware.
    assert not asyncio.iscoroutinefunction(app._middleware_chain)
    # Entered once per request, and the thread kept for the next one.
    assert len(app.threads) == 3 and len(set(app.threads)) == 1
    assert threading.get_ident() not in app.threads
    assert len(app._idle_threads) == 1


def test_a_non_streamed_answer_is_one_hand_off_to_the_request_thread(monkeypatch):
    """request_started, the chain and the response's close (request_finished,
    the connection back to the pool) in one call on the request's thread:
    Django's handler makes three."""
    submitted = []
    original = RequestThread.submit

    def counting(self, fn, /, *args, **kwargs):
        submitted.append(fn)
        return original(self, fn, *args, **kwargs)

    monkeypatch.setattr(RequestThread, "submit", counting)
    app = Recording()
    _, secret = make_api_key(make_tenant())
    signals = []

    def note(sender, **kwargs):
        signals.append((kwargs["signal"], threading.get_ident()))

    request_started.connect(note)
    request_finished.connect(note)
    try:
        status, _ = async_to_sync(call)(
            app, "/api/v1/agents", {"Authorization": f"Bearer {secret}"}
        )
    finally:
        request_started.disconnect(note)
        request_finished.disconnect(note)
    assert status == 200
    assert len(submitted) == 1
    assert [signal for signal, _ in signals] == [request_started, request_finished]
    assert {thread for _, thread in signals} == set(app.threads)


def test_a_request_whose_client_left_finishes_before_its_thread_serves_another():
    """asgiref waits for a cancelled call's sync code to return; the thread
    is only then handed to the next request."""
    app = Recording(delay=0.5)

    async def leave_then_ask_again():
        left = await call(app, "/healthz", leave_after=0.05)
        finished_before_next = app.finished.is_set()
        return left, finished_before_next, await call(app, "/healthz")

    left, finished_before_next, (status, body) = async_to_sync(leave_then_ask_again)()
    assert left == (None, b"")  # never answered: the client had gone
    assert finished_before_next
    assert status == 200 and body == b'{"status":"ok"}'
    assert len(app.threads) == 2 and app.threads[0] == app.threads[1]


def test_after_a_burst_of_requests_only_so_many_threads_are_kept(monkeypatch):
    monkeypatch.setattr("config.asgi.IDLE_THREADS", 2)
    app = Recording(delay=0.2)

    async def five_at_once():
        return await asyncio.gather(*(call(app, "/healthz") for _ in range(5)))

    answers = async_to_sync(five_at_once)()
    assert [status for status, _ in answers] == [200] * 5
    assert len(set(app.threads)) == 5  # one thread each, at the same time
    assert len(app._idle_threads) == 2


def test_a_request_thread_is_idle_only_once_its_calls_are_done():
    thread = RequestThread()
    release = threading.Event()
    try:
        assert thread.idle
        running = thread.submit(release.wait, 5)
        assert not thread.idle
        release.set()
        running.result(timeout=5)
        # Done callbacks run just after the result is set.
        deadline = time.monotonic() + 5
        while not thread.idle and time.monotonic() < deadline:
            time.sleep(0.01)
        assert thread.idle
    finally:
        release.set()
        thread.shutdown()


class FailingInATransaction(Recording):
    """A view that fails inside `atomic` after a query: answered 500 by
    Django's own conversion of an exception, as in the web process."""

    def load_middleware(self, is_async=False):
        super().load_middleware(is_async)

        def chain(request):
            with transaction.atomic():
                Tenant.objects.exists()
                raise RuntimeError("the view failed mid-transaction")

        self._middleware_chain = convert_exception_to_response(chain)


def kept_thread_state(app) -> tuple[bool, bool]:
    """On the one thread kept for the next request: whether its connection
    is closed, and whether an atomic block is still open on it."""
    (thread,) = app._idle_threads

    def state():
        return connection.connection is None, connection.in_atomic_block

    return thread.submit(state).result(timeout=5)


def test_a_kept_thread_holds_no_connection_or_transaction_of_its_last_request():
    """Thread-locals outlive a request on a kept thread, and the next request
    may be another tenant's: its connection goes back to the pool and no
    transaction stays open, after a request answered, failed or left."""
    _, secret = make_api_key(make_tenant())
    normal, failing, left = Recording(), FailingInATransaction(), Recording(0.3)

    async def each():
        answered = await call(
            normal, "/api/v1/agents", {"Authorization": f"Bearer {secret}"}
        )
        failed = await call(failing, "/healthz")
        gone = await call(
            left,
            "/api/v1/agents",
            {"Authorization": f"Bearer {secret}"},
            leave_after=0.05,
        )
        return answered[0], failed[0], gone[0]

    assert async_to_sync(each)() == (200, 500, None)
    for app in (normal, failing, left):
        assert kept_thread_state(app) == (True, False), app


def signalled(fn):
    """What `fn` returns, and the request signals sent meanwhile, in order."""
    seen = []

    def note(sender, **kwargs):
        seen.append(kwargs["signal"])

    request_started.connect(note)
    request_finished.connect(note)
    try:
        return fn(), seen
    finally:
        request_started.disconnect(note)
        request_finished.disconnect(note)


class Answering(OneHopASGIHandler):
    """A chain that queries, waits `delay` and answers what `make` returns;
    `closed` notes each close of the response's resources."""

    def __init__(self, make, delay: float = 0.0) -> None:
        super().__init__()
        self.make, self.delay = make, delay
        self.closed: list[bool] = []

    def get_response(self, request):
        Tenant.objects.exists()
        time.sleep(self.delay)
        response = self.make()
        response._resource_closers.append(lambda: self.closed.append(True))
        return response


async def three_parts():
    for _ in range(3):
        await asyncio.sleep(0.01)
        yield b"a"


@pytest.mark.parametrize("streamed", [False, True], ids=["bytes", "streamed"])
def test_a_request_whose_client_left_during_its_view_ends_once(streamed):
    """As in Django's handler, one request_finished for a request whose
    client left before its answer (31b1565 sent two for a non-streamed one:
    its close in `respond`, then the handler's own), and its response closed
    (a streamed one was dropped unclosed)."""

    def make():
        return StreamingHttpResponse(three_parts()) if streamed else HttpResponse(b"x")

    app = Answering(make, delay=0.3)
    left, signals = signalled(lambda: async_to_sync(call)(app, "/x", leave_after=0.05))
    assert left == (None, b"")
    assert signals == [request_started, request_finished]
    assert app.closed == [True]
    assert kept_thread_state(app) == (True, False)


class Stop(BaseException):
    """Escapes Django's conversion of exceptions to responses."""


def test_a_kept_thread_holds_no_connection_of_a_request_whose_handling_raised():
    """An exception escaping the request's sync work (a BaseException, a
    signal receiver's error) still ends the request on its thread: its
    connection goes back to the pool before the thread serves another."""

    def make():
        raise Stop()

    app = Answering(make)
    with pytest.raises(Stop):
        async_to_sync(call)(app, "/x")
    assert kept_thread_state(app) == (True, False)


def test_a_request_started_receivers_error_ends_the_request_too():
    """A receiver that took a connection and failed: the request_finished
    receivers (Django's close_old_connections) still run."""
    app = Answering(lambda: HttpResponse(b"x"))

    def failing(sender, **kwargs):
        Tenant.objects.exists()  # a connection taken, then the receiver fails
        raise RuntimeError("a receiver failed")

    request_started.connect(failing)
    try:
        with pytest.raises(RuntimeError):
            async_to_sync(call)(app, "/x")
    finally:
        request_started.disconnect(failing)
    assert kept_thread_state(app) == (True, False)


def test_a_non_streamed_answer_takes_two_tasks_in_the_event_loop():
    """Its hop to the request's thread and Django's watch for a disconnect:
    no task of its own for sending the answer, and no asyncio.wait over the
    two (Django's handler creates three tasks and waits on two)."""
    app = Recording()
    created = []

    async def counted():
        loop = asyncio.get_running_loop()
        default = loop.get_task_factory()

        def factory(loop, coro, **kwargs):
            created.append(getattr(coro, "__qualname__", repr(coro)))
            if default is not None:
                return default(loop, coro, **kwargs)
            return asyncio.Task(coro, loop=loop, **kwargs)

        loop.set_task_factory(factory)
        try:
            return await call(app, "/healthz")
        finally:
            loop.set_task_factory(default)

    status, body = async_to_sync(counted)()
    assert status == 200 and body == b'{"status":"ok"}'
    assert len(created) == 2, created


def test_a_streamed_answer_is_stopped_when_its_client_leaves():
    """A streamed body is sent with the disconnect watched: a client that
    leaves mid-stream ends the send and the response is closed."""
    closed = threading.Event()

    async def forever():
        yield b"first"
        await asyncio.Event().wait()

    class Streaming(OneHopASGIHandler):
        def get_response(self, request):
            response = StreamingHttpResponse(forever())
            response._resource_closers.append(closed.set)
            return response

    status, body = async_to_sync(call)(Streaming(), "/healthz", leave_after=0.05)
    assert status == 200 and body == b"first"
    assert closed.is_set()
