"""Exported web pages opened in a real headless Chromium (Debian's, driven by Playwright given its path; never a
downloaded browser): the fixtures every page test shares. A test file imports ``browser`` and ``open_page``."""

from __future__ import annotations

import shutil

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture(scope="module")
def browser():
    if not shutil.which(CHROMIUM):
        pytest.fail(f"no Chromium at {CHROMIUM}: `make browser` installs Debian's chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM,
                                              args=["--no-sandbox", "--disable-background-networking"])
        yield chromium
        chromium.close()


@pytest.fixture()
def open_page(browser):
    """Opens a page file in a fresh tab; fails the test on any request beyond the file itself, or any script error."""
    opened = []

    def opener(path, width: int = 1000, height: int = 700):
        page = browser.new_page(viewport={"width": width, "height": height})
        requests: list[str] = []
        page.on("request", lambda request: requests.append(request.url))
        page.goto(path.as_uri())
        opened.append((page, requests, path.as_uri()))
        return page

    yield opener
    for page, requests, url in opened:
        assert requests == [url], f"the page asked for more than itself: {requests}"
        page.close()


def rgb(colour: str) -> str:
    """``#RRGGBB`` as a browser's computed style writes it."""
    return "rgb({}, {}, {})".format(*(int(colour[k:k + 2], 16) for k in (1, 3, 5)))
