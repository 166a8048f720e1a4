"""Shared fixtures: tiny random-weight models (seconds) and the real default model (fetched once)."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest


@pytest.fixture(scope="session")
def tiny_lm():
    from playground.tiny_models import build_tiny_lm

    return build_tiny_lm(seed=0)


@pytest.fixture(scope="session")
def tiny_lm_eos():
    """A tiny model that often ends at EOS within a few tokens."""
    from playground.tiny_models import build_tiny_lm

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
def _collect_garbage_on_the_gui_thread():
    """Once a Qt job has run, automatic collection is off (``playground.ui.gui_gc``): collect between tests, on the
    main thread, so garbage does not pile up in tests that spin no event loop."""
    yield
    import sys

    gui_gc = sys.modules.get("playground.ui.gui_gc")
    if gui_gc is not None:
        gui_gc.collect_now()
