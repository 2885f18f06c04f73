"""Runs web, a Celery worker and Celery beat together: the embedded mode.

Ctrl-C (or SIGTERM) stops all three; if one of them dies, the others are
stopped too, so the mode never half-runs.
"""

import os
import signal
import subprocess
import sys
import time

from django.conf import settings
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Start web (runserver), a Celery worker and Celery beat; stop all on Ctrl-C."

    def add_arguments(self, parser):
        parser.add_argument("--addrport", default="127.0.0.1:8000")
        parser.add_argument("--concurrency", type=int, default=2)

    def handle(self, *args, addrport: str, concurrency: int, **options):
        for folder in ("queue", "processed", "control"):
            (settings.EMBEDDED_BROKER_DIR / folder).mkdir(parents=True, exist_ok=True)
        python = sys.executable
        celery = [python, "-m", "celery", "-A", "config"]
        # The file broker has no fanout exchange: no gossip, mingle or remote control.
        quiet = ["--without-gossip", "--without-mingle", "--without-heartbeat"]
        commands = {
            "web": [python, "manage.py", "runserver", addrport, "--noreload"],
            "worker": [
                *celery,
                "worker",
                "--loglevel=INFO",
                f"--concurrency={concurrency}",
                *quiet,
            ],
            "beat": [
                *celery,
                "beat",
                "--loglevel=INFO",
                f"--schedule={settings.VAR_DIR / 'celerybeat-schedule'}",
            ],
        }
        children = {
            name: subprocess.Popen(
                command, env=os.environ.copy(), start_new_session=True
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
        for child in children.values():
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for child in children.values():
            try:
                child.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
        self.stdout.write("stopped web, worker and beat")
        sys.exit(exit_code)
