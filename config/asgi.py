"""The web process of both modes: gunicorn's uvicorn workers serve this ASGI
application (config/gunicorn_conf.py), so streaming endpoints can be async views.
"""

import os
import threading
from concurrent.futures import ThreadPoolExecutor

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
                # it cannot be stopped in (asgiref waits for a cancelled call's
                # sync code, so only when the server cancels this coroutine
                # itself): the thread ends once it is done.
                thread.shutdown(wait=False)

    async def get_response_async(self, request):
        return await sync_to_async(self.get_response, thread_sensitive=True)(request)


django.setup(set_prefix=False)
application = OneHopASGIHandler()
