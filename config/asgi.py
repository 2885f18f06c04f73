"""The web process of both modes: gunicorn's uvicorn workers serve this ASGI
application (config/gunicorn_conf.py), so streaming endpoints can be async views.
"""

import contextvars
import os
import threading
from concurrent.futures import Executor, ThreadPoolExecutor

import django
from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.core.handlers.asgi import ASGIHandler

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


def _pooled_connections_back() -> None:
    """Give this thread's pooled database connections back to the pool (as
    runs.streaming.release_connection does for the default one): a thread
    going back to the idle list holds none. Without a pool (SQLite) they stay,
    as on any kept request thread."""
    from django.db import connections

    for conn in connections.all(initialized_only=True):
        if getattr(conn, "pool", None) is not None and not conn.in_atomic_block:
            conn.close()


def _one_call(fn, args, kwargs):
    try:
        return fn(*args, **kwargs)
    finally:
        _pooled_connections_back()


class RequestExecutor(Executor):
    """Where a request's thread-sensitive calls run: on the request's own
    thread until its view has returned a response to stream; then (its
    middleware and view done, only a stream's few sync calls left: a run's
    look-up, `response.close()`) on an idle thread taken for each call and
    given back after it, so a request that waits or streams keeps no thread
    while it waits. One call at a time either way (a request awaits each)."""

    def __init__(self, handler: "OneHopASGIHandler") -> None:
        self._handler = handler
        self.thread: RequestThread | None = handler._take_thread()

    def submit(self, fn, /, *args, **kwargs):
        if self.thread is not None:
            return self.thread.submit(fn, *args, **kwargs)
        thread = self._handler._take_thread()
        future = thread.submit(_one_call, fn, args, kwargs)
        future.add_done_callback(lambda _: self._handler._give_back(thread))
        return future

    def let_go(self) -> None:
        """The request's thread back to the idle list, once its connection is
        back in the pool; later calls take a thread each."""
        thread, self.thread = self.thread, None
        if thread is not None:
            released = thread.submit(_pooled_connections_back)
            released.add_done_callback(lambda _: self._handler._give_back(thread))

    def shutdown(self, wait=True, *, cancel_futures=False) -> None:
        pass  # its threads are the handler's


_request_executor: contextvars.ContextVar[RequestExecutor] = contextvars.ContextVar(
    "request_executor"
)


class OneHopASGIHandler(ASGIHandler):
    """Django's ASGI handler with the middleware chain and the view run as
    under WSGI: on one thread, entered once per request.

    Every view and most middleware are synchronous. In Django's async mode the
    chain switches between the event loop and the request's thread at each
    change of kind (a sync middleware, an async one, the sync view), and each
    MiddlewareMixin's hooks hop on their own: a dozen hand-offs per request,
    most of the web process's CPU outside the views (bench/web_cpu.py). Here
    the request reaches the chain through one `sync_to_async`, on the same
    per-request thread Django would use (thread-sensitive, in the request's
    ThreadSensitiveContext), so database connections and thread-locals behave
    as before. What a view returns to stream (an async iterator) is still
    iterated in the event loop by `send_response`, and the request's thread
    goes back to the idle list as soon as the view has returned it
    (RequestExecutor): a request that waits or streams keeps no thread.

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
        executor = RequestExecutor(self)
        token = _request_executor.set(executor)
        try:
            async with ThreadSensitiveContext(executor=executor):
                await self.handle(scope, receive, send)
        finally:
            _request_executor.reset(token)
            thread, executor.thread = executor.thread, None
            if thread is not None:
                self._give_back(thread)

    def _take_thread(self) -> RequestThread:
        # Only the event loop's thread takes; others only give back (a
        # borrowed call's end), so a non-empty list stays non-empty here.
        return self._idle_threads.pop() if self._idle_threads else RequestThread()

    def _give_back(self, thread: RequestThread) -> None:
        if thread.idle and len(self._idle_threads) < IDLE_THREADS:
            self._idle_threads.append(thread)
        else:
            # Beyond the threads worth keeping, or still running sync code
            # it cannot be stopped in (asgiref waits for a cancelled call's
            # sync code, so only when the server cancels this coroutine
            # itself): the thread ends once it is done.
            thread.shutdown(wait=False)

    async def run_get_response(self, request):
        response = await super().run_get_response(request)
        if response.streaming:
            # The request's sync work is done: what is left is the stream's.
            _request_executor.get().let_go()
        return response

    async def get_response_async(self, request):
        return await sync_to_async(self.get_response, thread_sensitive=True)(request)


django.setup(set_prefix=False)
application = OneHopASGIHandler()
