"""Gatehouse settings: one module, every value read through django-environ.

Every variable is documented in docs/configuration.md; keep the two in step.
"""

from datetime import timedelta
from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()

# The embedded mode keeps everything it needs (database, broker queue, generated
# master key) in one folder, so a fresh clone runs with no services at all.
VAR_DIR = Path(env.str("GATEHOUSE_VAR_DIR", default=str(BASE_DIR / "var")))

DEBUG = env.bool("DEBUG", default=False)
SECRET_KEY = env.str(
    "SECRET_KEY",
    default="embedded-insecure-secret-key-set-SECRET_KEY-in-production"
    if DEBUG
    else "",
)
if not SECRET_KEY:
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured("SECRET_KEY must be set when DEBUG is off.")
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["127.0.0.1", "localhost"])
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_celery_beat",
    "runs",
    "audit",
    "approvals",
    "retention",
    "demo",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "runs.api.middleware.ApiBodySizeLimitMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

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

WSGI_APPLICATION = "config.wsgi.application"

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
else:
    DATABASES["default"].setdefault(
        "CONN_MAX_AGE", env.int("DATABASE_CONN_MAX_AGE", 60)
    )
    DATABASES["default"].setdefault("CONN_HEALTH_CHECKS", True)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Cache (throttling counters; use Redis when several web processes run) ---
CACHES = {"default": env.cache_url("CACHE_URL", default="locmemcache://gatehouse")}

# --- Auth ---------------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "/admin/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"
        if DEBUG
        else "whitenoise.storage.CompressedManifestStaticFilesStorage"
    },
}
# Serve collected files and, without collectstatic, the apps' own static folders
# (the admin, the Swagger UI bundle) so the API docs page needs no CDN.
WHITENOISE_USE_FINDERS = True

# --- Email (escalation notices) -----------------------------------------------
EMAIL_BACKEND = env.str(
    "EMAIL_BACKEND", default="django.core.mail.backends.console.EmailBackend"
)
DEFAULT_FROM_EMAIL = env.str("DEFAULT_FROM_EMAIL", default="gatehouse@localhost")

# --- API ------------------------------------------------------------------------
# Largest request body the API accepts; larger ones answer 413.
GATEHOUSE_MAX_BODY_BYTES = env.int("GATEHOUSE_MAX_BODY_BYTES", default=1_048_576)
DATA_UPLOAD_MAX_MEMORY_SIZE = GATEHOUSE_MAX_BODY_BYTES
GATEHOUSE_IDEMPOTENCY_TTL = timedelta(hours=24)

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "runs.api.authentication.ApiKeyAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["runs.api.permissions.TenantScopePermission"],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PAGINATION_CLASS": "runs.api.pagination.CursorPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "DEFAULT_THROTTLE_CLASSES": ["runs.api.throttling.PrincipalRateThrottle"],
    "DEFAULT_THROTTLE_RATES": {
        "principal": env.str("GATEHOUSE_THROTTLE_RATE", default="600/minute")
    },
    "EXCEPTION_HANDLER": "runs.api.errors.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
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
    # A late-acked task is redelivered after this long without an ack; longer
    # than any run's lease, so a slow run is not delivered twice while alive.
    CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600}
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_IGNORE_RESULT = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
CELERY_TIMEZONE = "UTC"
CELERY_TASK_ALWAYS_EAGER = False

# --- Gatehouse ---------------------------------------------------------------------
# The master key ring: "id:base64key,..."; the first key wraps new data keys.
# Parsed and validated in runs.crypto (and nowhere else).
GATEHOUSE_MASTER_KEYS = env.str("GATEHOUSE_MASTER_KEYS", default="")
GATEHOUSE_MASTER_KEY_FILE = VAR_DIR / "master.key"
# The audit key ring, same format: HMAC keys that seal the audit trail's blocks
# and sign its heads. Kept out of the database on purpose (docs/security.md).
GATEHOUSE_AUDIT_KEYS = env.str("GATEHOUSE_AUDIT_KEYS", default="")
GATEHOUSE_AUDIT_KEY_FILE = VAR_DIR / "audit.key"
# Key of the audit trail's argument digests (audit.redaction); unset, derived
# from SECRET_KEY. Set it to keep digests comparable across a SECRET_KEY rotation.
GATEHOUSE_AUDIT_DIGEST_KEY = env.str("GATEHOUSE_AUDIT_DIGEST_KEY", default="")

# Agents bundled with Gatehouse, as name@version -> "module:factory".
GATEHOUSE_BUILTIN_AGENTS = {"refund@1": "demo.agents.refund:build_graph"}
# More agents from the environment: "name@version=package.module:factory,...".
GATEHOUSE_AGENTS = env.str("GATEHOUSE_AGENTS", default="")
# The demo payments provider's response latency in seconds (tests use it to
# kill a worker inside the crash window).
GATEHOUSE_DEMO_PAYMENT_LATENCY = env.float(
    "GATEHOUSE_DEMO_PAYMENT_LATENCY", default=0.0
)
# How long a run's lease lasts without a heartbeat before another worker may
# take the run over; workers renew it every third of that.
GATEHOUSE_RUN_LEASE_SECONDS = env.int("GATEHOUSE_RUN_LEASE_SECONDS", default=30)
# Default time, by risk, before an approval request is due (tenants' retention
# policies override it).
GATEHOUSE_APPROVAL_DUE_HOURS = {"low": 24, "medium": 8, "high": 4}
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
