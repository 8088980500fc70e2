"""Browser fixtures: pytest-django's live server and a headless Debian Chromium
driven by Playwright.

Chromium is the system one (/usr/bin/chromium): nothing downloads a browser at test time. Tests
skip when it is missing. Playwright's sync API runs an event loop in this thread, which makes
Django refuse synchronous ORM calls; the tests only touch the ORM outside Playwright calls, so that
guard is lifted.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "screenshots"


# Package scope: Playwright's sync API keeps an event loop running in this thread while the browser
# lives; it must be gone before tests elsewhere call asyncio.run().
@pytest.fixture(scope="package")
def browser():
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI_BROWSER_REQUIRED"):  # .ci/run installs it: missing there is a failure
            pytest.fail(f"{CHROMIUM} is not installed, and CI_BROWSER_REQUIRED is set")
        pytest.skip(f"{CHROMIUM} is not installed (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield b
        b.close()


@pytest.fixture
def page(browser, live_server, django_db_serialized_rollback):
    """A fresh context per test. Records dialogs (alert/confirm) so XSS tests can
    assert none opened.

    Serialized rollback: the live server needs real commits, and the flush that follows must not
    take other apps' migrated rows (default labels) away from the tests that run after these."""
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    pg = context.new_page()
    pg.dialogs = []
    pg.page_errors = []

    def on_dialog(dialog):
        pg.dialogs.append(dialog.message)
        dialog.dismiss()

    pg.on("dialog", on_dialog)
    pg.on("pageerror", lambda exc: pg.page_errors.append(str(exc)))
    # Console errors (a missing favicon, a failed fetch, a script error) are listed per page opened.
    pg.console_errors = []
    pg.on(
        "console", lambda m: m.type == "error" and pg.console_errors.append(f"{pg.url}: {m.text}")
    )
    pg.set_default_timeout(15_000)
    yield pg
    context.close()


@pytest.fixture
def shot():
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)

    def save(pg, name: str, full_page: bool = True) -> Path:
        path = SCREENSHOTS / f"{name}.png"
        pg.screenshot(path=str(path), full_page=full_page)
        return path

    return save


def login(pg, live_server, username: str, password: str) -> None:
    pg.goto(live_server.url + "/")
    pg.wait_for_url("**/accounts/login/**")
    pg.fill('input[name="username"]', username)
    pg.fill('input[name="password"]', password)
    pg.click('button[type="submit"]')
    pg.wait_for_url(live_server.url + "/")
