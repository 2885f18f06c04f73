"""Gatehouse in processes of its own, configured only by their environment.

Settings are read once, at start-up, from the environment: the only faithful
test of a mode is a fresh process that sees nothing of the test run's own
configuration (no DJANGO_SETTINGS_MODULE=tests.settings, no test keys),
exactly as an operator's shell would start it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
# What a login shell has; nothing of Gatehouse's configuration.
_SHELL_VARIABLES = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "USER")
# A production configuration: what the production docs tell an operator to set.
# The database is named, not used, unless a test says otherwise.
PRODUCTION = {
    "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/gatehouse_unused",
    "CELERY_BROKER_URL": "redis://127.0.0.1:6379/15",
    "SECRET_KEY": "q3N7vY0d-5kWm2Lr8xT1cZ6bHs9uJ4pE_aGf0nVyR7tQw2eK5oXi8zLm3BjD6hUs",
    "GATEHOUSE_MASTER_KEYS": "k1:dGVzdC1tYXN0ZXIta2V5LW51bWJlci1vbmUtMzJieSE=",
    "GATEHOUSE_AUDIT_KEYS": "a1:dGVzdC1hdWRpdC1rZXktbnVtYmVyLW9uZS0zMmJ5dCE=",
    "ALLOWED_HOSTS": "gatehouse.example.com,127.0.0.1",
}


def shell_env(**variables: str) -> dict[str, str]:
    """The environment of a fresh shell plus `variables`."""
    base = {name: os.environ[name] for name in _SHELL_VARIABLES if name in os.environ}
    return {**base, **variables}


def production_env(**variables: str) -> dict[str, str]:
    return shell_env(**{**PRODUCTION, **variables})


def without(env: dict[str, str], *names: str) -> dict[str, str]:
    return {name: value for name, value in env.items() if name not in names}


def manage(
    *args: str,
    env: dict[str, str],
    cwd: Path = ROOT,
    python: str = PYTHON,
    timeout: float = 120,
    umask: int = 0o022,
) -> subprocess.CompletedProcess:
    """`python manage.py *args` in a fresh process, as an operator types it
    (in a shell with `umask`)."""
    return subprocess.run(
        [python, "manage.py", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        umask=umask,
    )


def settings_in_process(
    env: dict[str, str], *names: str, entry_point: str = "settings"
) -> dict:
    """The values of settings `names` in a fresh process that starts the way a
    process of that kind starts: `web` imports config.asgi (what gunicorn
    loads), `celery` imports config.celery (what a worker loads); `settings`
    only reads the settings module, as every process does first."""
    start = {
        "settings": "",
        "web": "import config.asgi",
        "celery": "import config.celery",
    }[entry_point]
    script = (
        "import json, os\n"
        "os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'config.settings')\n"
        f"{start}\n"
        "from django.conf import settings\n"
        f"print(json.dumps({{n: getattr(settings, n) for n in {list(names)!r}}},"
        " default=str))\n"
    )
    result = subprocess.run(
        [PYTHON, "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def gunicorn_command(port: int, *, workers: int = 2) -> list[str]:
    """The production web server as README.md starts it, on 127.0.0.1:port."""
    return [
        PYTHON,
        "-m",
        "gunicorn",
        "--config",
        "config/gunicorn_conf.py",
        "--bind",
        f"127.0.0.1:{port}",
        "--workers",
        str(workers),
        "config.asgi:application",
    ]
