"""Debian's Chromium, driven by Playwright: the web page's tests and its bench (bench/ui.py) launch it alike."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from playwright.sync_api import sync_playwright

CHROMIUM = Path(os.environ.get("GPULANE_CHROMIUM", "/usr/bin/chromium"))
# Chromium as root without a sandbox, and quiet: this machine's network is closed, and a browser that calls
# home at every start has its connections refused.
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-sync",
        "--disable-background-networking", "--disable-component-update"]  # fmt: skip


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium (Playwright's Browser), closed afterwards. Playwright never downloads a browser here."""
    if not CHROMIUM.exists():
        raise AssertionError(f"{CHROMIUM} is missing: `make browser` installs Debian's chromium (docs/development.md)")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            yield browser
        finally:
            browser.close()


def log_in(page: Any, url: str, secret: str, view: str = "lanes") -> None:
    """Through the page's own login form, as a person does; returns once the view is live."""
    page.goto(f"{url}/#{view}")
    page.fill("#secret", secret)
    page.click("#login-form button")
    page.wait_for_selector("#live.on")


# Installed in a page: window.shown[job] becomes the wall-clock time (seconds) at which each job first shows
# among the running jobs. This machine's clock is the test's too, so it compares with a watch's time.
RECORD_SHOWN = """() => {
    window.shown = {};
    new MutationObserver(() => {
        const now = Date.now() / 1000;
        for (const a of document.querySelectorAll('.running-job a, tr.running a')) window.shown[a.textContent] ??= now;
    }).observe(document.getElementById('view'), {childList: true, subtree: true});
}"""


def shown_at(page: Any, job: str) -> float | None:
    """When ``job`` first showed among the running jobs (``RECORD_SHOWN``), or None yet."""
    value = page.evaluate("job => window.shown[job] ?? null", job)
    return None if value is None else float(value)
