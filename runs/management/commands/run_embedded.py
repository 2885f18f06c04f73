"""The embedded mode, as `make run` starts it.

Migrates the SQLite database, creates the demo tenant, people and key (and
prints them), then runs the production web server (gunicorn with uvicorn
workers, config/gunicorn_conf.py), a Celery worker and Celery beat together.
Ctrl-C (or SIGTERM) stops all three; if one of them dies, the others are
stopped too, so the mode never half-runs.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from config import embedded
from runs import crypto

# How long the three get to stop by themselves before they are killed.
STOP_TIMEOUT_SECONDS = 20


class Command(BaseCommand):
    help = (
        "Start the embedded mode: migrate, create the demo users and key, then run "
        "the web server, a Celery worker and Celery beat; Ctrl-C stops all three."
    )

    def add_arguments(self, parser):
        parser.add_argument("--bind", default="127.0.0.1:8000", help="host:port")
        parser.add_argument(
            "--concurrency", type=int, default=2, help="Celery worker processes"
        )

    def handle(self, *args, bind: str, concurrency: int, **options):
        if not settings.GATEHOUSE_EMBEDDED:
            raise CommandError(
                "run_embedded runs the embedded mode (no DATABASE_URL); in production "
                "start gunicorn, Celery workers and Celery beat (README, Production)"
            )
        embedded.secure_tree(settings.VAR_DIR)
        call_command("migrate", verbosity=0)
        call_command("setup_demo", url=f"http://{bind}", stdout=self.stdout)
        warnings = crypto.development_key_warnings()
        if warnings:
            self.stderr.write("\n".join(["!" * 78, *warnings, "!" * 78, ""]))
        # Before the three start writing to the same output.
        self.stdout.flush()
        self.stderr.flush()

        for folder in ("queue", "processed", "control"):
            (settings.EMBEDDED_BROKER_DIR / folder).mkdir(parents=True, exist_ok=True)
        # WhiteNoise serves collected files from here, if any, besides the apps'.
        Path(settings.STATIC_ROOT).mkdir(exist_ok=True)
        python = sys.executable
        celery = [python, "-m", "celery", "-A", "config"]
        # The file broker has no fanout exchange: no gossip, mingle or remote control.
        quiet = ["--without-gossip", "--without-mingle", "--without-heartbeat"]
        commands = {
            "web": [
                python,
                "-m",
                "gunicorn",
                "--config",
                str(settings.BASE_DIR / "config" / "gunicorn_conf.py"),
                "--bind",
                bind,
                "--workers",
                "1",
                "config.asgi:application",
            ],
            "worker": [
                *celery,
                "worker",
                "--loglevel=INFO",
                f"--concurrency={concurrency}",
                *quiet,
            ],
            "beat": [*celery, "beat", "--loglevel=INFO"],
        }
        # Each in a session of its own: Ctrl-C reaches this process only, which
        # stops the three in order, children and all.
        children = {
            name: subprocess.Popen(
                command,
                cwd=settings.BASE_DIR,
                env=os.environ.copy(),
                start_new_session=True,
            )
            for name, command in commands.items()
        }
        stopping = False

        def stop(signum=None, frame=None):
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        exit_code = 0
        while not stopping:
            for name, child in children.items():
                if child.poll() is not None:
                    self.stderr.write(
                        f"{name} exited with {child.returncode}; stopping"
                    )
                    exit_code = 1
                    stopping = True
            time.sleep(0.5)
        _stop_all(children.values())
        self.stdout.write("stopped web, worker and beat")
        sys.exit(exit_code)


def _stop_all(children) -> None:
    """SIGTERM each child (gunicorn and Celery stop their own workers
    gracefully), then SIGKILL whatever is left in its process group: a child
    that outlived the timeout, or a worker its parent left behind."""
    for child in children:
        if child.poll() is None:
            child.terminate()
    deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
    for child in children:
        try:
            child.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        child.wait()
