"""One headless Chromium for each test module (Debian's, driven by Playwright; never a browser of
Playwright's own download; closed with the module: Playwright's sync API keeps an event loop
running while it is open, and every later test that calls asyncio.run() would fail under it),
and a page opener that blocks every request that is not the file itself, records the ones
attempted and every console message, and waits for the report's viewer to say it has drawn.
Without Chromium the tests skip loudly, except in CI (CI=true), where `make install-test`
installs it and a missing browser fails them."""

from __future__ import annotations

import os
import platform
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("LLMOPT_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--disable-quic"]


def _no_browser(why: str):
    if os.environ.get("CI"):
        pytest.fail(f"{why}: CI must run the browser tests (make install-test installs Debian's chromium)")
    pytest.skip(f"NO BROWSER TESTS: {why} (as root on Linux: make install-test, or apt-get install chromium)")


@pytest.fixture(scope="module")
def browser():
    if platform.system() != "Linux":
        _no_browser(f"not Linux ({platform.system()})")
    if not Path(CHROMIUM).is_file():
        _no_browser(f"no Chromium at {CHROMIUM}")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _no_browser("Playwright for Python is not installed (pip install -e '.[test]')")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


@dataclass
class Opened:
    page: object
    console: list[tuple[str, str]] = field(default_factory=list)
    requested: list[str] = field(default_factory=list)  # every request but the file itself, each aborted

    def errors(self) -> list[str]:
        return [f"{kind}: {text}" for kind, text in self.console if kind in ("error", "pageerror", "warning")]

    def wait_drawn(self, timeout_ms: int = 120_000) -> None:
        """Polled from here: Playwright's wait_for_function evaluates a string in the page, which
        the report's content security policy (no eval) refuses."""
        import time

        end = time.monotonic() + timeout_ms / 1000
        while self.page.evaluate("document.body ? document.body.dataset.ready || null : null") is None:
            if time.monotonic() > end:
                raise TimeoutError(f"the report did not say it was drawn within {timeout_ms / 1000:g} s")
            self.page.wait_for_timeout(50)

    def data(self) -> dict:
        """The page's data as the browser parsed it."""
        return self.page.evaluate("JSON.parse(document.getElementById('llmopt-data').textContent)")

    def chart(self, cid: str) -> list[dict]:
        """A drawn chart's traces as plotly holds them (x, y, name)."""
        return self.page.evaluate("(id) => { const d = document.getElementById(id); return d && d.data ? "
                                  "d.data.map(t => ({name: t.name, x: Array.from(t.x || []), y: Array.from(t.y || [])})) : null; }", cid)


@pytest.fixture(scope="module")
def open_report(browser):
    opened: list = []

    def open_(path: Path, timeout_ms: int = 120_000, wait: bool = True) -> Opened:
        """The page, drawn (wait=False: only started, for several pages to draw at once; then wait_drawn)."""
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        got = Opened(page)
        page.on("console", lambda m: got.console.append((m.type, m.text)))
        page.on("pageerror", lambda e: got.console.append(("pageerror", str(e))))
        page.on("dialog", lambda d: (got.console.append(("dialog", d.message)), d.dismiss()))
        file_url = Path(path).resolve().as_uri()

        def route(r):
            if r.request.url == file_url:
                return r.continue_()
            got.requested.append(r.request.url)
            return r.abort()
        page.route("**/*", route)
        page.goto(file_url, wait_until="commit")
        opened.append(page)
        if wait:
            got.wait_drawn(timeout_ms)
        return got

    yield open_
    for page in opened:
        if not page.is_closed():
            page.close()
