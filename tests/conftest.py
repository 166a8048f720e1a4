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
