"""Gunicorn's settings for the web process, the same in both modes.

    gunicorn -c config/gunicorn_conf.py config.asgi:application

Uvicorn workers serve the ASGI application, so streaming endpoints are async
views that wait in the event loop (their request's thread stays reserved,
idle, until the answer ends: docs/scaling.md). The rest comes from gunicorn's own
command line or environment: `--bind` (or PORT), `--workers` (or
WEB_CONCURRENCY), FORWARDED_ALLOW_IPS (the proxies whose X-Forwarded-For and
X-Forwarded-Proto are believed; 127.0.0.1 by default).
"""

worker_class = "uvicorn_worker.UvicornWorker"
accesslog = "-"
# On a restart or Ctrl-C, requests in flight get this long to finish before
# their worker is stopped; a stream's client reconnects and resumes.
graceful_timeout = 10
# No `gunicornc` control socket: its default path is one per user, which
# several gunicorns on a machine (tests, two checkouts) would fight over.
control_socket_disable = True
