"""A real headless Chromium driven by Playwright, for the console's browser tests (tests/e2e/test_console*.py).

Debian's `chromium` (/usr/bin/chromium, or `CRASHSAFE_CHROMIUM`), not Playwright's downloaded build: CI installs
the package (`.ci/run`), nothing is fetched at test time. A missing browser fails the test with what to install;
it never skips. Import the fixtures into a test module with `from tests.support.browser import browser, page`.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from playwright.async_api import BrowserContext, Page, async_playwright

DEFAULT_CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# Whatever the page waits on (an SSE event, a swap) gets this long: the machine is shared and slow.
EXPECT_TIMEOUT_MS = 30_000


def chromium_path() -> str:
    path = os.environ.get("CRASHSAFE_CHROMIUM", DEFAULT_CHROMIUM)
    if not (Path(path).is_file() and os.access(path, os.X_OK)) and shutil.which(path) is None:
        pytest.fail(
            f"no Chromium at {path}: install Debian's `chromium` package (`apt-get install -y chromium`; .ci/run"
            " does it on CI) or point CRASHSAFE_CHROMIUM at a Chromium binary",
            pytrace=False,
        )
    return path


@pytest.fixture(scope="module")
async def browser(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[BrowserContext]:
    """One headless Chromium per test module, with a fresh user-data-dir (no profile, no state from anywhere)."""
    executable = chromium_path()
    async with async_playwright() as pw:
        context = await pw.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")),
            executable_path=executable,
            headless=True,
            args=ARGS,
            viewport={"width": 1360, "height": 900},
        )
        context.set_default_timeout(EXPECT_TIMEOUT_MS)
        try:
            yield context
        finally:
            await context.close()


@pytest.fixture
async def page(browser: BrowserContext) -> AsyncIterator[Page]:
    """A new tab with no cookies: every test signs in as whom it needs."""
    await browser.clear_cookies()
    tab = await browser.new_page()
    try:
        yield tab
    finally:
        await tab.close()


async def signed_in(page: Page, base_url: str, key: str, next_path: str = "/console/runs") -> Page:
    """Sign in through the form, as a person would, and land on `next_path`."""
    await page.goto(f"{base_url}/console/signin?next={next_path}")
    await page.fill("input[name=key]", key)
    await page.click("button[type=submit]")
    await page.wait_for_url(f"{base_url}{next_path}*")
    return page
