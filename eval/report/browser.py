"""Headless Chromium for the report's browser tests, its benchmark and the screenshot in docs/report.md:
the system's Chromium (Debian's `chromium` package), driven by Playwright; nothing is downloaded."""

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CHROMIUM = os.environ.get("ADAFUSE_CHROMIUM", "/usr/bin/chromium")
# Headless, and nothing that would reach the network: no updates, no sync, no first-run pages.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@contextmanager
def chromium() -> Iterator:
    """A Playwright browser on the system's Chromium."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def screenshot(page_path: Path, png: Path, width: int = 1280, height: int = 900) -> Path:
    """The top of a report as a reader first sees it, as a PNG."""
    with chromium() as browser:
        page = browser.new_page(viewport={"width": width, "height": height})
        page.goto(Path(page_path).resolve().as_uri())
        page.wait_for_selector("body[data-ready=true]")
        page.screenshot(path=str(png))
    return png
