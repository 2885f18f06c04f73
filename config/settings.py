"""Gatehouse settings: one module, every value read through django-environ.

Every variable is documented in docs/configuration.md; keep the two in step.
"""

from datetime import timedelta
from pathlib import Path

import environ
from csp.constants import NONE, SELF, UNSAFE_INLINE
from django.core.exceptions import ImproperlyConfigured

from config import embedded

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()

# --- Mode and secrets -----------------------------------------------------------
# The embedded mode is chosen by the absence of DATABASE_URL, never by DEBUG:
# SQLite, a file broker and generated secrets, all in one private folder, so a
# fresh checkout runs with no services and every manage.py command, Celery
# process and test run from the checkout works after `make run` with nothing
# typed in front. Production (DATABASE_URL set) brings its own secrets.
GATEHOUSE_EMBEDDED = not env.str("DATABASE_URL", default="")
VAR_DIR = Path(env.str("GATEHOUSE_VAR_DIR", default=str(BASE_DIR / "var")))
if GATEHOUSE_EMBEDDED:
    embedded.make_private(VAR_DIR)
    # Django's storages chmod what they write (0644 by default): keep it private.
    FILE_UPLOAD_PERMISSIONS = embedded.PRIVATE_FILE_MODE
    FILE_UPLOAD_DIRECTORY_PERMISSIONS = embedded.PRIVATE_DIR_MODE

# Off by default in both modes: no stack-trace page is ever shown to a reviewer.
DEBUG = env.bool("DEBUG", default=False)

SECRET_KEY = env.str("SECRET_KEY", default="")
# The master key ring: "id:base64key,..."; the first key wraps new data keys.
# Parsed and validated in runs.crypto (and nowhere else).
GATEHOUSE_MASTER_KEYS = env.str("GATEHOUSE_MASTER_KEYS", default="")
# The audit key ring, same format: HMAC keys that seal the audit trail's blocks
# and sign its heads. Kept out of the database on purpose (docs/security.md).
GATEHOUSE_AUDIT_KEYS = env.str("GATEHOUSE_AUDIT_KEYS", default="")
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=[])
# The embedded mode's generated development keys in use, by the setting each
# stands in for (runs.crypto warns about them); empty in production.
GATEHOUSE_DEVELOPMENT_KEY_FILES: dict[str, Path] = {}
if GATEHOUSE_EMBEDDED:
    SECRET_KEY = SECRET_KEY or embedded.generated_secret(
        VAR_DIR / "secret.key", make=embedded.random_secret_key
    )
    if not GATEHOUSE_MASTER_KEYS:
        GATEHOUSE_DEVELOPMENT_KEY_FILES["GATEHOUSE_MASTER_KEYS"] = (
            VAR_DIR / "master.key"
        )
        GATEHOUSE_MASTER_KEYS = embedded.development_key_ring(
            VAR_DIR / "master.key", key_id="embedded-1"
        )
    if not GATEHOUSE_AUDIT_KEYS:
        GATEHOUSE_DEVELOPMENT_KEY_FILES["GATEHOUSE_AUDIT_KEYS"] = VAR_DIR / "audit.key"
        GATEHOUSE_AUDIT_KEYS = embedded.development_key_ring(
            VAR_DIR / "audit.key", key_id="embedded-audit-1"
        )
    ALLOWED_HOSTS = ALLOWED_HOSTS or ["127.0.0.1", "localhost"]
else:
    _KEY_RING_EXAMPLE = (
        "python3 -c 'import base64,os; "
        'print("k1:"+base64.b64encode(os.urandom(32)).decode())\''
    )
    _missing = [
        message
        for value, message in (
            (
                SECRET_KEY,
                "SECRET_KEY is not set: production (DATABASE_URL is set) needs a "
                "long random one, e.g. python3 -c 'import secrets; "
                "print(secrets.token_urlsafe(50))'.",
            ),
            (
                GATEHOUSE_MASTER_KEYS,
                "GATEHOUSE_MASTER_KEYS is not set: production needs a master key "
                f'ring "id:base64key", e.g. {_KEY_RING_EXAMPLE}.',
            ),
            (
                GATEHOUSE_AUDIT_KEYS,
                "GATEHOUSE_AUDIT_KEYS is not set: production needs an audit key "
                f"ring (another key, same format), e.g. {_KEY_RING_EXAMPLE}.",
            ),
            (
                ALLOWED_HOSTS,
                "ALLOWED_HOSTS is not set: production needs the host names it "
                "answers to, comma-separated (e.g. gatehouse.example.com).",
            ),
        )
        if not value
    ]
    if _missing:
        raise ImproperlyConfigured("\n".join(_missing))
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])

INSTALLED_APPS = [
    "config.admin.GatehouseAdminConfig",  # django.contrib.admin, lookups validated
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "csp",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_celery_beat",
    "axes",
    "runs",
    "audit",
    "approvals",
    "retention",
    "demo",
    "webhooks",
    "agent_protocol",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # A view failing because the database or broker is down answers 503.
    "runs.api.errors.OutageMiddleware",
    # django-csp's, with the policy built once (config/csp.py).
    "config.csp.CSPMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "runs.api.middleware.ApiBodySizeLimitMiddleware",
    # Django's session, authentication and messages middleware, stepped over
    # by an API request that authenticates with a key (its caller is the key,
    # not a session: runs.api.middleware.keyed); the same for the rest. CSRF's
    # is Django's own, by name, as `check --deploy` (security.W003) wants it.
    "runs.api.middleware.BrowserSessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "runs.api.middleware.BrowserAuthenticationMiddleware",
    # The reader's time zone, for the admin's pages (runs.timezones).
    "runs.timezones.ReaderTimezoneMiddleware",
    "runs.api.middleware.BrowserMessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last, as django-axes asks: answers a locked-out login with 429.
    "axes.middleware.AxesMiddleware",
]

# --- Login throttling (django-axes): the admin's login ---------------------------
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
# A username is locked out from an address after this many wrong passwords in a
# row, for GATEHOUSE_LOGIN_LOCKOUT_MINUTES or until a compliance officer of one
# of its tenants lifts it in the admin (runs.logins).
AXES_FAILURE_LIMIT = env.int("GATEHOUSE_LOGIN_FAILURE_LIMIT", default=5)
AXES_COOLOFF_TIME = timedelta(
    minutes=env.int("GATEHOUSE_LOGIN_LOCKOUT_MINUTES", default=30)
)
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_ENABLE_ADMIN = False  # runs.logins has the admin page, scoped by tenant
AXES_VERBOSE = False

ROOT_URLCONF = "config.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# The web server serves config.asgi (gunicorn with uvicorn workers); wsgi.py
# remains for Django's own tools (runserver).
WSGI_APPLICATION = "config.wsgi.application"
ASGI_APPLICATION = "config.asgi.application"

# --- Database -----------------------------------------------------------------
EMBEDDED_DATABASE_URL = f"sqlite:///{VAR_DIR / 'gatehouse.sqlite3'}"
DATABASES = {"default": env.db_url("DATABASE_URL", default=EMBEDDED_DATABASE_URL)}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # WAL lets readers proceed while one writer writes; IMMEDIATE takes the write
    # lock when a transaction starts, so web, worker and beat queue for it
    # (busy timeout) instead of failing with "database is locked" mid-transaction.
    DATABASES["default"]["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
elif env.bool("DATABASE_POOL", default=False):
    # The web process (config/asgi.py turns this on) runs each request's sync
    # code on one thread per concurrent request, kept for the next ones: a
    # connection kept per thread would hold one open per thread, idle between
    # requests, so connections come from a psycopg pool, one per process, and
    # go back to it at the end of every request. Persistent connections are
    # off with a pool.
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": env.int("DATABASE_POOL_MIN_SIZE", default=2),
        "max_size": env.int("DATABASE_POOL_MAX_SIZE", default=10),
        "timeout": env.int("DATABASE_POOL_TIMEOUT", default=10),
    }
else:
    # Celery workers, beat and manage.py are synchronous, one thread per
    # process: a persistent connection, health-checked before reuse, kept by a
    # worker from task to task (CELERY_DB_REUSE_MAX below, config.celery). The
    # short-lived threads of a run (LangGraph's checkpoint writes, the lease
    # heartbeat) hand theirs on to the next ones (runs.thread_connections).
    DATABASES["default"].setdefault(
        "CONN_MAX_AGE", env.int("DATABASE_CONN_MAX_AGE", 60)
    )
    DATABASES["default"].setdefault("CONN_HEALTH_CHECKS", True)
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # Django's backend with the 65535-parameter limit of server-side binding
    # declared, so bulk writes and deletions go in batches that fit.
    DATABASES["default"]["ENGINE"] = "config.postgresql"
    # psycopg sends a query's parameters apart from its SQL (server-side
    # binding) instead of quoting them into it, and prepares a statement the
    # sixth time a connection runs it (psycopg's threshold; a statement run
    # once, a migration's, is never prepared): Postgres then parses and plans
    # each recurring query of the web tier and the workers once per
    # connection, not at every call. A pooler in transaction mode that does
    # not track prepared statements (PgBouncer before 1.21, or without
    # max_prepared_statements) would run them on sessions that never saw
    # them: DATABASE_PREPARED_STATEMENTS=false there.
    _options = DATABASES["default"].setdefault("OPTIONS", {})
    _options.setdefault("server_side_binding", True)
    _options.setdefault(
        "prepare_threshold",
        5 if env.bool("DATABASE_PREPARED_STATEMENTS", default=True) else None,
    )
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Cache (throttling counters; use Redis when several web processes run) ---
CACHES = {"default": env.cache_url("CACHE_URL", default="locmemcache://gatehouse")}
if CACHES["default"]["BACKEND"] == "django.core.cache.backends.redis.RedisCache":
    # The same, reusing one redis-py client per connection pool (runs/cache.py).
    CACHES["default"]["BACKEND"] = "runs.cache.RedisCache"

# --- Auth ---------------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "/admin/login/"

# --- Deployment security ----------------------------------------------------------
# Transport security is on by default in production, which is served over TLS
# (directly or behind a proxy). The embedded mode serves plain http on
# 127.0.0.1: a Secure cookie would never come back over http and the admin
# login would fail, so there the transport settings default off; its cookies
# never leave the machine. Every one of them can be set either way.
_SERVED_OVER_TLS = not GATEHOUSE_EMBEDDED
SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", default=_SERVED_OVER_TLS)
# Load balancers and orchestrators probe over plain http.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$"]
# Behind a TLS-terminating proxy that sets it: "HTTP_X_FORWARDED_PROTO,https".
# Only when the proxy always sets or strips that header; otherwise a client
# could claim https. (gunicorn's uvicorn workers already trust it from
# FORWARDED_ALLOW_IPS, 127.0.0.1 by default.)
SECURE_PROXY_SSL_HEADER = env.tuple("SECURE_PROXY_SSL_HEADER", default=None)
SECURE_HSTS_SECONDS = env.int(
    "SECURE_HSTS_SECONDS", default=365 * 24 * 3600 if _SERVED_OVER_TLS else 0
)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool(
    "SECURE_HSTS_INCLUDE_SUBDOMAINS", default=True
)
# Preloading is a commitment registered with browser vendors, hard to undo: an
# operator opts in. Until then Django's reminder (W021) is silenced.
SECURE_HSTS_PRELOAD = env.bool("SECURE_HSTS_PRELOAD", default=False)
SILENCED_SYSTEM_CHECKS = [] if SECURE_HSTS_PRELOAD else ["security.W021"]
if GATEHOUSE_EMBEDDED:
    # SQLite ignores the INCLUDE columns of Postgres's covering indexes; the
    # embedded mode does without them, and `make run` should not say so each time.
    SILENCED_SYSTEM_CHECKS.append("models.W040")
SESSION_COOKIE_SECURE = env.bool("SESSION_COOKIE_SECURE", default=_SERVED_OVER_TLS)
CSRF_COOKIE_SECURE = env.bool("CSRF_COOKIE_SECURE", default=_SERVED_OVER_TLS)
SESSION_COOKIE_SAMESITE = env.str("SESSION_COOKIE_SAMESITE", default="Lax")
CSRF_COOKIE_SAMESITE = env.str("CSRF_COOKIE_SAMESITE", default="Lax")
# A reviewer's admin session lasts a working day, not Django's two weeks.
SESSION_COOKIE_AGE = env.int("SESSION_COOKIE_AGE", default=8 * 3600)
X_FRAME_OPTIONS = "DENY"
# django-csp, on every response. Scripts only from this origin's files (no
# inline script, no eval): an injected <script> does not run. Inline style
# attributes are allowed: the admin's templates and Swagger UI's page use them,
# and a style runs no code.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        "style-src": [SELF, UNSAFE_INLINE],
        "img-src": [SELF, "data:"],
        "object-src": [NONE],
        "base-uri": [NONE],
        "frame-ancestors": [NONE],
        "form-action": [SELF],
    }
}

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
# Times to the second with their zone, everywhere in the admin (config/formats).
FORMAT_MODULE_PATH = ["config.formats"]

STATIC_URL = "static/"
# Where `collectstatic` puts the files; the embedded mode needs none there (the
# apps' own folders are served as they are), but the command works in it too.
STATIC_ROOT = Path(
    env.str(
        "STATIC_ROOT",
        default=str(
            VAR_DIR / "static" if GATEHOUSE_EMBEDDED else BASE_DIR / "staticfiles"
        ),
    )
)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    # Production serves `collectstatic`'s hashed, compressed files; the embedded
    # mode serves the apps' own static folders as they are (no collectstatic).
    "staticfiles": {
        "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"
        if GATEHOUSE_EMBEDDED
        else "whitenoise.storage.CompressedManifestStaticFilesStorage"
    },
}
# Serve collected files and, without collectstatic, the apps' own static folders
# (the admin, the Swagger UI bundle) so the API docs page needs no CDN.
WHITENOISE_USE_FINDERS = True

# --- Email (approval notices: approvals.notifications) ----------------------------
EMAIL_BACKEND = env.str(
    "EMAIL_BACKEND", default="django.core.mail.backends.console.EmailBackend"
)
DEFAULT_FROM_EMAIL = env.str("DEFAULT_FROM_EMAIL", default="gatehouse@localhost")
# The SMTP backend's server; the password only from the environment.
EMAIL_HOST = env.str("EMAIL_HOST", default="localhost")
EMAIL_PORT = env.int("EMAIL_PORT", default=587)
EMAIL_HOST_USER = env.str("EMAIL_HOST_USER", default="")
EMAIL_HOST_PASSWORD = env.str("EMAIL_HOST_PASSWORD", default="")
EMAIL_USE_TLS = env.bool("EMAIL_USE_TLS", default=True)
EMAIL_TIMEOUT = env.int("EMAIL_TIMEOUT", default=30)

# --- API ------------------------------------------------------------------------
# Largest request body the API accepts; larger ones answer 413.
GATEHOUSE_MAX_BODY_BYTES = env.int("GATEHOUSE_MAX_BODY_BYTES", default=1_048_576)
DATA_UPLOAD_MAX_MEMORY_SIZE = GATEHOUSE_MAX_BODY_BYTES
GATEHOUSE_IDEMPOTENCY_TTL = timedelta(hours=24)
# Failed API authentications an address may make in a window; past it, 429.
GATEHOUSE_AUTH_FAILURE_RATE = env.str(
    "GATEHOUSE_AUTH_FAILURE_RATE", default="30/minute"
)

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "runs.api.authentication.ApiKeyAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["runs.api.permissions.TenantScopePermission"],
    # Depth, non-finite numbers and 64-bit integers checked at the boundary;
    # a stored value JSON cannot hold renders as unreadable (runs.api.parsers).
    "DEFAULT_PARSER_CLASSES": ["runs.api.parsers.StrictJSONParser"],
    "DEFAULT_RENDERER_CLASSES": ["runs.api.parsers.SafeJSONRenderer"],
    "DEFAULT_CONTENT_NEGOTIATION_CLASS": "runs.api.parsers.JSONContentNegotiation",
    "DEFAULT_PAGINATION_CLASS": "runs.api.pagination.CursorPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "DEFAULT_THROTTLE_CLASSES": ["runs.api.throttling.PrincipalRateThrottle"],
    "DEFAULT_THROTTLE_RATES": {
        "principal": env.str("GATEHOUSE_THROTTLE_RATE", default="600/minute")
    },
    # A client's address for the throttles (DRF's get_ident) is REMOTE_ADDR:
    # behind a proxy, uvicorn sets it from the X-Forwarded-For of the proxies
    # FORWARDED_ALLOW_IPS trusts. Unset, DRF would take the whole header as
    # the address, and a client sending its own would get a fresh window of
    # failed authentications (and an anonymous budget) per request.
    "NUM_PROXIES": 0,
    "EXCEPTION_HANDLER": "runs.api.errors.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "runs.api.schema.GatehouseAutoSchema",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Gatehouse API",
    "DESCRIPTION": "Durable, supervised, auditable agent runs.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "SCHEMA_PATH_PREFIX": "/api/v1",
    "COMPONENT_SPLIT_REQUEST": True,
    "ENUM_NAME_OVERRIDES": {
        "ThreadStatusEnum": "runs.models.threads.Thread.Status",
        "RunStatusEnum": "runs.models.execution.Run.Status",
        "ApprovalStatusEnum": "approvals.models.ApprovalRequest.Status",
    },
    # Error responses per operation come from runs.api.schema.GatehouseAutoSchema.
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "runs.api.schema.examples_hook",
    ],
}

# --- Celery -----------------------------------------------------------------------
EMBEDDED_BROKER_DIR = VAR_DIR / "broker"
CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default="filesystem://")
if CELERY_BROKER_URL.startswith("filesystem://"):
    # Kombu's filesystem transport: one folder of message files, shared by every
    # process on this machine; nothing to install or run.
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(EMBEDDED_BROKER_DIR / "queue"),
        "data_folder_out": str(EMBEDDED_BROKER_DIR / "queue"),
        "processed_folder": str(EMBEDDED_BROKER_DIR / "processed"),
        "control_folder": str(EMBEDDED_BROKER_DIR / "control"),
        "store_processed": False,
    }
else:
    # A late-acked task is redelivered after this long without an ack (by a
    # broker that emulates acks with it; not Redis's, below); longer than any
    # run's lease, so a slow run is not delivered twice while alive.
    CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600}
if CELERY_BROKER_URL.startswith(("redis://", "rediss://")):
    # No ack emulation: kombu's Redis transport would note each message a
    # worker takes in two keys (a MULTI pipeline, a round trip before the
    # worker sees it) and remove the note on the ack (another), to redeliver
    # the message a visibility timeout after its worker died: ~0.4 of the
    # worker parent's ~1.4 ms of CPU a task (docs/scaling.md, "A run's task").
    # Every task that must happen is found again from the database, sooner: a
    # run by the recovery sweep (its lease expired, or queued with nobody on
    # it), a webhook delivery by `webhooks.dispatch_due`, a deletion by
    # `retention.carry_out_deletions` (tests/runs/test_worker_crash.py SIGKILLs
    # workers holding runs), an approval e-mail by the approvals sweep (owed
    # in the database, sent after a grace; approvals.notifications.send_owed).
    # kombu still hands back, from the worker's memory, the task of a pool
    # process that died (reject_on_worker_lost) and, at a warm shutdown (a
    # deploy), the messages the worker held.
    CELERY_BROKER_TRANSPORT_OPTIONS["ack_emulation"] = False
if CELERY_BROKER_URL.startswith("redis://"):
    # kombu's, keeping the client it publishes with (runs.broker says why).
    CELERY_BROKER_TRANSPORT = "runs.broker:Transport"
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_IGNORE_RESULT = True
# Celery's defaults, restated: it reads these on every task it sends, and a
# setting found here is read in ~8 us, one left to its default in ~30 (looked
# for under each of its names here first).
CELERY_TASK_DEFAULT_QUEUE = "celery"
CELERY_TASK_SEND_SENT_EVENT = False
CELERY_BROKER_POOL_ACQUIRE_TIMEOUT = None
# Celery's Django fixup closes every database connection before and after each
# task unless this is set (then only once every that many tasks): a new
# Postgres session for every task. Workers keep theirs as Django keeps a
# persistent connection, closed by DATABASE_CONN_MAX_AGE, after errors and
# failed health checks: config.celery applies Django's rule around each task.
CELERY_DB_REUSE_MAX = 1_000_000
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# django-celery-beat's DatabaseScheduler, made to outlive a database outage.
CELERY_BEAT_SCHEDULER = "runs.beat:OutageTolerantScheduler"
CELERY_TIMEZONE = "UTC"
CELERY_TASK_ALWAYS_EAGER = False

# --- Gatehouse ---------------------------------------------------------------------
# GATEHOUSE_MASTER_KEYS and GATEHOUSE_AUDIT_KEYS: under "Mode and secrets" above.
# Key of the audit trail's argument digests (audit.redaction); unset, derived
# from SECRET_KEY. Set it to keep digests comparable across a SECRET_KEY rotation.
GATEHOUSE_AUDIT_DIGEST_KEY = env.str("GATEHOUSE_AUDIT_DIGEST_KEY", default="")

# Agents bundled with Gatehouse, as name@version -> "module:factory".
GATEHOUSE_BUILTIN_AGENTS = {
    "refund@1": "demo.agents.refund:build_graph",
    "fulfilment@1": "demo.agents.fulfilment:build_graph",
}
# More agents from the environment: "name@version=package.module:factory,...".
GATEHOUSE_AGENTS = env.str("GATEHOUSE_AGENTS", default="")
# The demo payments provider's response latency in seconds (tests use it to
# kill a worker inside the crash window).
GATEHOUSE_DEMO_PAYMENT_LATENCY = env.float(
    "GATEHOUSE_DEMO_PAYMENT_LATENCY", default=0.0
)
# How long the demo stand-ins take to undo (release stock, refund a charge,
# cancel a courier), after the undo is committed: tests kill a worker there.
GATEHOUSE_DEMO_UNDO_LATENCY = env.float("GATEHOUSE_DEMO_UNDO_LATENCY", default=0.0)
# The format values are written in. Every release reads every earlier format;
# "2026-12-01" writes what the releases of 1-5 December 2026 can read (zstd
# frames with their magic number, a checkpoint's `ts` as text), for a rolling
# upgrade from them: set it on the upgraded processes until none of the old
# ones runs, then unset it (docs/operations.md, Upgrading).
GATEHOUSE_WRITE_FORMATS = ("2026-12-01", "2026-12-06")
GATEHOUSE_WRITE_FORMAT = env.str("GATEHOUSE_WRITE_FORMAT", default="2026-12-06")
if GATEHOUSE_WRITE_FORMAT not in GATEHOUSE_WRITE_FORMATS:
    raise ImproperlyConfigured(
        f"GATEHOUSE_WRITE_FORMAT must be one of {', '.join(GATEHOUSE_WRITE_FORMATS)}"
    )
# How long a run's lease lasts without a heartbeat before another worker may
# take the run over; workers renew it every third of that.
GATEHOUSE_RUN_LEASE_SECONDS = env.int("GATEHOUSE_RUN_LEASE_SECONDS", default=30)
# How long a worker keeps retrying a write (a checkpoint, claiming or finishing
# a run) while the database is unavailable before it gives the run up to the
# recovery sweep (runs.outages).
GATEHOUSE_OUTAGE_RETRY_SECONDS = env.int("GATEHOUSE_OUTAGE_RETRY_SECONDS", default=60)
# How often each worker asks for the recovery sweep of stalled runs, so that
# recovery does not depend on beat alone (runs.bootsteps).
GATEHOUSE_RECOVERY_SWEEP_SECONDS = env.int(
    "GATEHOUSE_RECOVERY_SWEEP_SECONDS", default=15
)
# Default time, by risk, before an approval request is due (tenants' retention
# policies override it).
GATEHOUSE_APPROVAL_DUE_HOURS = {"low": 24, "medium": 8, "high": 4}
# Where workers publish run stream events for web processes to relay
# (runs.streaming): a Redis URL, or "database" (the embedded mode's default:
# rows polled by the readers). Defaults to the broker's Redis when it is one.
GATEHOUSE_STREAM_URL = env.str(
    "GATEHOUSE_STREAM_URL",
    default=CELERY_BROKER_URL
    if CELERY_BROKER_URL.startswith(("redis://", "rediss://"))
    else "database",
)
# How long a run's stream events are kept after its last one: a client can
# rejoin a stream (Last-Event-ID) that long.
GATEHOUSE_STREAM_TTL_SECONDS = env.int("GATEHOUSE_STREAM_TTL_SECONDS", default=3600)
# Webhooks (webhooks.services): whether targets may be loopback or private
# addresses (the embedded mode's default, and the tests'; not in production),
# the timeout of one attempt, the first retry's delay (doubling up to an hour),
# and the attempts before a delivery is given up.
GATEHOUSE_WEBHOOK_ALLOW_PRIVATE = env.bool(
    "GATEHOUSE_WEBHOOK_ALLOW_PRIVATE",
    default=GATEHOUSE_EMBEDDED,
)
GATEHOUSE_WEBHOOK_TIMEOUT_SECONDS = env.float(
    "GATEHOUSE_WEBHOOK_TIMEOUT_SECONDS", default=10.0
)
GATEHOUSE_WEBHOOK_RETRY_SECONDS = env.float(
    "GATEHOUSE_WEBHOOK_RETRY_SECONDS", default=10.0
)
GATEHOUSE_WEBHOOK_MAX_ATTEMPTS = env.int("GATEHOUSE_WEBHOOK_MAX_ATTEMPTS", default=8)
# Versions that start no new threads: "name@version,...".
GATEHOUSE_DRAINING_AGENTS = env.list("GATEHOUSE_DRAINING_AGENTS", default=[])

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="INFO")},
}

# --- Retention ---------------------------------------------------------------------
# Defaults of every tenant's retention policy (retention.models.RetentionPolicy);
# a tenant admin overrides them per tenant in the admin.
# A thread with no activity for this long is expired: key shredded, rows removed.
GATEHOUSE_CHECKPOINT_TTL_DAYS = env.int("GATEHOUSE_CHECKPOINT_TTL_DAYS", default=90)
# Checkpoints kept per thread (and subgraph namespace) by the pruning job.
GATEHOUSE_KEEP_LATEST_CHECKPOINTS = env.int(
    "GATEHOUSE_KEEP_LATEST_CHECKPOINTS", default=20
)
# Audit events older than this are purged (whole sealed blocks); never shorter
# than the checkpoint TTL.
GATEHOUSE_AUDIT_RETENTION_DAYS = env.int(
    "GATEHOUSE_AUDIT_RETENTION_DAYS", default=7 * 365
)
# The shortest audit retention a tenant's policy may set: the operator's floor,
# so that no tenant admin can have the trail of what happened purged within days.
GATEHOUSE_AUDIT_RETENTION_MIN_DAYS = env.int(
    "GATEHOUSE_AUDIT_RETENTION_MIN_DAYS", default=365
)
# The escalation chain of an unanswered approval: a reminder to reviewers at its
# due time, then compliance officers this many hours after the reminder, then
# expiry (a denial with a system note that resumes the run) this many hours
# after the escalation.
GATEHOUSE_APPROVAL_ESCALATE_AFTER_HOURS = env.int(
    "GATEHOUSE_APPROVAL_ESCALATE_AFTER_HOURS", default=4
)
GATEHOUSE_APPROVAL_EXPIRE_AFTER_HOURS = env.int(
    "GATEHOUSE_APPROVAL_EXPIRE_AFTER_HOURS", default=24
)
# Rows (threads, approvals, requests) each retention batch takes; one batch is
# one short transaction. Every audit event is a savepoint: a batch stays under
# the 64 subtransactions Postgres tracks per transaction without slowing every
# other session's snapshots.
GATEHOUSE_RETENTION_BATCH_SIZE = env.int("GATEHOUSE_RETENTION_BATCH_SIZE", default=50)
# A scheduled retention job stops after this long and the next run goes on, so
# runs of one job do not pile up; `manage.py retention_run` has no limit.
GATEHOUSE_RETENTION_TIME_BUDGET_SECONDS = env.int(
    "GATEHOUSE_RETENTION_TIME_BUDGET_SECONDS", default=240
)
# Where links in notices point (the admin of this deployment).
GATEHOUSE_BASE_URL = env.str("GATEHOUSE_BASE_URL", default="http://127.0.0.1:8000")
# --- end Retention -----------------------------------------------------------------
