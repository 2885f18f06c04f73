"""Browser tests: Debian's Chromium driven headless by Playwright.

Playwright never downloads a browser here: it launches the system Chromium
(`.ci/run` installs it with apt). Screenshots go to GATEHOUSE_SCREENSHOT_DIR
when it is set (`make screenshots` sets it to docs/screenshots), otherwise to
the test's temporary directory.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from django.db import connections

CHROMIUM = os.environ.get("GATEHOUSE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
]


@pytest.fixture
def browser(monkeypatch):
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium package")
    # Playwright's sync API keeps an event loop running in this thread; the
    # test's own ORM calls are synchronous all the same.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True
        )
        yield browser
        browser.close()
        # With a loop running, Django keys connections by context rather than
        # by thread: the test body used a connection of its own. Close it, or
        # it outlives the test database.
        connections.close_all()


@pytest.fixture
def screenshot_dir(tmp_path) -> Path:
    configured = os.environ.get("GATEHOUSE_SCREENSHOT_DIR")
    path = Path(configured) if configured else tmp_path
    path.mkdir(parents=True, exist_ok=True)
    return path
