"""Shared fixtures: tiny random-weight models (seconds) and the real default model (fetched once)."""

from __future__ import annotations

import os
import shutil

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest

# A test that asks for one of these fixtures, however indirectly, carries the marker: `-m "not model and not server"`
# (`make test-fast`) then leaves out every test that needs the real default model or a built llama-server.
MARKED_BY_FIXTURE = {"default_lm": "model", "llama_server_url": "server"}


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(items):
    for item in items:
        for fixture, marker in MARKED_BY_FIXTURE.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(marker)


@pytest.fixture(scope="session")
def tiny_lm():
    from support.tiny_models import build_tiny_lm

    return build_tiny_lm(seed=0)


@pytest.fixture(scope="session")
def tiny_lm_eos():
    """A tiny model that often ends at EOS within a few tokens."""
    from support.tiny_models import build_tiny_lm

    return build_tiny_lm(seed=1, eos_bias=2.5)


@pytest.fixture(scope="session")
def model_folder(tiny_lm, tmp_path_factory):
    """``tiny_lm`` saved as a Hugging Face folder (for the CLI and the loaders)."""
    folder = tmp_path_factory.mktemp("tiny-model")
    tiny_lm.model.save_pretrained(folder)
    tiny_lm.tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def default_lm():
    """The real default model (SmolLM2-135M-Instruct), fetched and converted once into the user cache."""
    from playground.config import ModelSettings
    from playground.models.default_model import fetch_default_model
    from playground.models.loading import load_model

    fetch_default_model()
    return load_model(ModelSettings(device="cpu", dtype="float32"))


@pytest.fixture(autouse=True)
def _delete_closed_widgets_now(request):
    """After a Qt test: delete the widgets pytest-qt closed (``deleteLater``) and collect their Python garbage, here
    and now, on the main thread.

    pytest-qt's ``processEvents`` does not run deferred deletes, so closed views used to die during a *later* test's
    event loop, after the cyclic collector had already cleared their Python side: signals then reached slots that
    were gone ("Slot 'KVView::' not found") and a paint of a half-collected pyqtgraph axis crashed the suite.
    """
    yield
    if "qtbot" not in request.fixturenames and "qapp" not in request.fixturenames:
        return
    import gc

    from PySide6.QtCore import QCoreApplication, QEvent

    if QCoreApplication.instance() is not None:
        QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
        gc.collect()
        QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
        # What survived is in use (session fixtures, models): leave it out of later scans, so this costs
        # milliseconds per test instead of a full scan of torch's objects (~0.2 s).
        gc.freeze()


@pytest.fixture(scope="session")
def llama_server_url(default_lm, tmp_path_factory):
    """The real llama-server (``make llama-server`` builds it) serving the default model's own Q4_1 GGUF on
    127.0.0.1, on a free port; stopped when the session ends."""
    from llama_server import start_server, stop_server

    server, url = start_server(tmp_path_factory.mktemp("llama-server") / "server.log")
    yield url
    stop_server(server)


# Exported web pages are opened in a real headless Chromium: Debian's, driven by Playwright given its path (never a
# downloaded browser), launched once per test file that asks for it.
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
