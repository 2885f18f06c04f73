"""Settings for the test suite: the real Postgres and Redis, a fixed key ring.

Defaults only: a variable already set in the environment wins, so the suite
can be pointed at another database or broker.
"""

import os
import tempfile

os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gatehouse")
os.environ.setdefault("CELERY_BROKER_URL", "redis://127.0.0.1:6379/15")
os.environ.setdefault("SECRET_KEY", "test-secret-key-not-for-production")
os.environ.setdefault("DEBUG", "false")
os.environ.setdefault("ALLOWED_HOSTS", "127.0.0.1,localhost")
# Two fixed test keys: "test-1" active, "test-0" an older one still in the ring.
os.environ.setdefault(
    "GATEHOUSE_MASTER_KEYS",
    "test-1:dGVzdC1tYXN0ZXIta2V5LW51bWJlci1vbmUtMzJieSE=,"
    "test-0:dGVzdC1tYXN0ZXIta2V5LW51bWJlci16ZXJvLTMyYiE=",
)
# The audit key ring: "audit-1" active, "audit-0" an older one still in the ring.
os.environ.setdefault(
    "GATEHOUSE_AUDIT_KEYS",
    "audit-1:dGVzdC1hdWRpdC1rZXktbnVtYmVyLW9uZS0zMmJ5dCE=,"
    "audit-0:dGVzdC1hdWRpdC1rZXktbnVtYmVyLXplcm8tMzJieSE=",
)
# Short leases so that a killed worker's run is taken over within seconds.
os.environ.setdefault("GATEHOUSE_RUN_LEASE_SECONDS", "3")
# The suite's workers leave recovery to the tests that ask for it (their own
# calls of runs_recover_stalled); tests of the workers' own sweep turn it on.
os.environ.setdefault("GATEHOUSE_RECOVERY_SWEEP_SECONDS", "0")
os.environ.setdefault("GATEHOUSE_VAR_DIR", "/tmp/gatehouse-test-var")
# Retention tests purge audit events days old; the operator's floor (365 days
# by default) is tested on its own (tests/retention/test_policies.py).
os.environ.setdefault("GATEHOUSE_AUDIT_RETENTION_MIN_DAYS", "1")
# Mail sent by the workers the suite starts lands in files here, where a test
# reads it (the test process itself uses Django's locmem outbox). Set once, so
# the workers, which inherit this environment, write where the tests look.
os.environ.setdefault(
    "GATEHOUSE_TEST_MAIL_DIR", tempfile.mkdtemp(prefix="gatehouse-test-mail-")
)
# Webhook receivers of the tests listen on 127.0.0.1, and retry at once.
os.environ.setdefault("GATEHOUSE_WEBHOOK_ALLOW_PRIVATE", "true")
os.environ.setdefault("GATEHOUSE_WEBHOOK_RETRY_SECONDS", "0.2")

from config.settings import *  # noqa: E402,F403
from tests.docs_examples import registrations  # noqa: E402

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
EMAIL_BACKEND = "django.core.mail.backends.filebased.EmailBackend"
EMAIL_FILE_PATH = os.environ["GATEHOUSE_TEST_MAIL_DIR"]
# The test client and the live servers of the browser tests speak plain http.
# Production's transport settings are tested in tests/test_deployment.py, from
# config.settings in processes of their own.
SECURE_SSL_REDIRECT = False
SESSION_COOKIE_SECURE = False
CSRF_COOKIE_SECURE = False
SECURE_HSTS_SECONDS = 0
# No collectstatic in tests: serve static files from the apps, unhashed.
STORAGES = {  # noqa: F405
    **STORAGES,  # noqa: F405
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
GATEHOUSE_AGENTS = os.environ.get(
    "GATEHOUSE_AGENTS",
    ",".join(
        [
            "echo@1=tests.agents:echo_graph",
            "echo@2=tests.agents:echo_graph",
            "gate@1=tests.agents:gate_graph",
            "pair@1=tests.agents:pair_graph",
            "duo@1=tests.agents:duo_graph",
            "twice@1=tests.agents:twice_graph",
            "incomplete@1=tests.agents:incomplete_payload_graph",
            "ask@1=tests.agents:question_graph",
            "flaky@1=tests.agents:flaky_graph",
            "chat@1=tests.agents:chat_graph",
            "pay@1=tests.agents:pay_graph",
            "slow@1=tests.agents:slow_graph",
            "tasks@1=tests.durable_agents:tasks_workflow",
            "deadline@1=tests.durable_agents:deadline_graph",
            "review@1=tests.durable_agents:review_graph",
            "order@1=tests.durable_agents:order_graph_v1",
            "order@2=tests.durable_agents:order_graph_v2",
            "undo@1=tests.durable_agents:saga_graph",
            *registrations(),
        ]
    ),
)

# A second database, SQLite, for the checkpoint store's conformance run
# (tests/runs/test_checkpointer_conformance.py); set up only for tests that ask
# for it. The same options as the embedded mode's SQLite.
DATABASES["sqlite"] = {  # noqa: F405
    "ENGINE": "django.db.backends.sqlite3",
    "NAME": os.path.join(tempfile.gettempdir(), "gatehouse-conformance.sqlite3"),
    "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 30},
    # Per process: two suites running at once must not share the file.
    "TEST": {
        "NAME": os.path.join(
            tempfile.gettempdir(), f"test_gatehouse-conformance-{os.getpid()}.sqlite3"
        )
    },
}
