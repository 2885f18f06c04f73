"""The web process of both modes: gunicorn's uvicorn workers serve this ASGI
application (config/gunicorn_conf.py), so streaming endpoints can be async views.
"""

import asyncio
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import django
from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.http import FileResponse
from django.urls import set_script_prefix

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
# Requests run their sync code on one thread per concurrent request, kept for
# the next (OneHopASGIHandler): Postgres connections come from a pool
# (config/settings.py, DATABASE_POOL_*), taken and given back per request, not
# one held open per thread.
os.environ.setdefault("DATABASE_POOL", "true")


class RequestThread(ThreadPoolExecutor):
    """The one thread of a request's thread-sensitive calls, kept for the
    next request once its calls are done (Django's handler starts and stops a
    thread per request)."""

    def __init__(self) -> None:
        super().__init__(max_workers=1, thread_name_prefix="request")
        self._pending = 0
        self._lock = threading.Lock()

    def submit(self, fn, /, *args, **kwargs):
        with self._lock:
            self._pending += 1
        future = super().submit(fn, *args, **kwargs)
        future.add_done_callback(self._done)
        return future

    def _done(self, _future) -> None:
        with self._lock:
            self._pending -= 1

    @property
    def idle(self) -> bool:
        with self._lock:
            return self._pending == 0


# Idle request threads a process keeps: a burst of concurrent requests (many
# streams at once) leaves no more than this many threads behind.
IDLE_THREADS = 32


class OneHopASGIHandler(ASGIHandler):
    """Django's ASGI handler with the middleware chain and the view run as
    under WSGI: on one thread, entered once per request.

    Every view and most middleware are synchronous. In Django's async mode the
    chain switches between the event loop and the request's thread at each
    change of kind (a sync middleware, an async one, the sync view), and each
    MiddlewareMixin's hooks hop on their own: a dozen hand-offs per request,
    most of the web process's CPU outside the views (bench/web_cpu.py); and
    Django's handler takes two more, for `request_started` and for the
    response's `close()`. Here a request's sync work is one `sync_to_async`
    (`respond`: the signals and the chain, for a non-streamed answer), on the same
    per-request thread Django would use (thread-sensitive, in the request's
    ThreadSensitiveContext), so database connections and thread-locals behave
    as before. What a view returns to stream (an async iterator) is still
    iterated in the event loop by `send_response`; the request's thread
    stays reserved (idle: its few sync calls, such as a stream's run
    look-ups, run on it) until the body ends, so each waiting request keeps
    one thread (docs/scaling.md).

    A kept thread serves requests of any tenant in turn, so nothing of a
    request may stay in its thread-locals: its connection goes back to the
    pool at `request_finished` and no transaction outlives the view
    (tests/deployment/test_asgi_handler.py); tenant state is never kept in a
    threading.local (what is: runs.crypto's codecs, runs.thread_connections).
    """

    def __init__(self) -> None:
        super().__init__()
        self._idle_threads: list[RequestThread] = []

    def load_middleware(self, is_async=False):
        super().load_middleware(is_async=False)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await super().__call__(scope, receive, send)
        thread = self._idle_threads.pop() if self._idle_threads else RequestThread()
        try:
            async with ThreadSensitiveContext(executor=thread):
                await self.handle(scope, receive, send)
        finally:
            if thread.idle and len(self._idle_threads) < IDLE_THREADS:
                self._idle_threads.append(thread)
            else:
                # Beyond the threads worth keeping, or still running sync code
                # it cannot be stopped in (`handle` waits for the `respond` of
                # a request whose client left, so only when the server cancels
                # this coroutine itself): the thread ends once it is done.
                thread.shutdown(wait=False)

    def respond(self, request):
        """The request's sync work, on its thread in one hop: Django's
        `request_started`, the middleware chain and the view, and, for an
        answer whose body is already bytes (not streamed), its `close()` with
        `request_finished` (the connection back to the pool). Django's
        handler takes a hop for each of the three (bench/web_cpu.py).

        What escapes (a BaseException, a signal receiver's error) ends the
        request all the same: its thread is kept for the next request, maybe
        another tenant's, so `request_finished` gives its connection back
        first (every receiver called, as `send_robust` does), unless the
        response's close had sent it."""
        response = None
        try:
            signals.request_started.send(sender=self.__class__, scope=request.scope)
            response = self.get_response(request)
            response._handler_class = self.__class__
            if isinstance(response, FileResponse):
                response.block_size = self.chunk_size  # as Django's handler does
            if not response.streaming:
                response.close()
        except BaseException:
            if response is None or not response.closed:
                signals.request_finished.send_robust(sender=self.__class__)
            raise
        return response

    async def handle(self, scope, receive, send):
        """Django's ASGIHandler.handle (5.2) with `respond` as its one hop.

        A streamed body is iterated in the event loop by `send_response` and
        closed after it, as in Django. A non-streamed one was closed by
        `respond` before it is sent, so `request_finished` comes a send
        earlier than in Django: nothing of the response is read after it but
        its bytes, headers and status. The event loop's part is two tasks
        (the hop and Django's watch for a disconnect), where Django's handler
        makes three and waits on two with asyncio.wait: ~3 % of a request's
        instructions (callgrind), the same answers; only a streamed body is
        sent from a task of its own, with the disconnect watched."""
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        set_script_prefix(get_script_prefix(scope))
        request, error_response = self.create_request(scope, body_file)
        if request is None:
            await signals.request_started.asend(sender=self.__class__, scope=scope)
            body_file.close()
            await self.send_response(error_response, send)
            await sync_to_async(error_response.close)()
            return

        # The hop runs to its end even if the client leaves meanwhile (a
        # thread cannot be stopped): its own task, awaited shielded. Django's
        # watch for a disconnect runs meanwhile, one task; a client that left
        # is sent nothing.
        hop = asyncio.ensure_future(
            sync_to_async(self.respond, thread_sensitive=True)(request)
        )
        watch = asyncio.ensure_future(self.listen_for_disconnect(receive))
        try:
            response = await asyncio.shield(hop)
        except BaseException:
            watch.cancel()
            raise
        if watch.done():
            try:
                watch.result()
            except RequestAborted:
                pass  # the client left before the answer
            finally:
                # Closed by `respond` if not streamed; a streamed answer,
                # never sent, is closed here.
                if not response.closed:
                    await sync_to_async(response.close)()
                body_file.close()
            return
        if not response.streaming:
            watch.cancel()  # closed by `respond`
            try:
                await self.send_response(response, send)
            finally:
                body_file.close()
            return

        async def stream_response(response, send):
            try:
                await self.send_response(response, send)
            except asyncio.CancelledError:
                pass  # the client disconnected during the send

        # A streamed body (a wait, a stream) is sent while Django's watch for
        # a disconnect runs: a client that leaves ends the send.
        tasks = [watch, asyncio.create_task(stream_response(response, send))]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            if task.done():
                try:
                    task.result()
                except RequestAborted:
                    pass
                except AssertionError:
                    body_file.close()
                    raise
            else:
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
        if not response.closed:
            await sync_to_async(response.close)()
        body_file.close()


django.setup(set_prefix=False)
application = OneHopASGIHandler()
