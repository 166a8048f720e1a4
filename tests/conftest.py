"""Shared fixtures: tiny random-weight models (seconds) and the real default model (fetched once)."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tiny_lm():
    from playground.tiny_models import build_tiny_lm

    return build_tiny_lm(seed=0)


@pytest.fixture(scope="session")
def tiny_lm_eos():
    """A tiny model that often ends at EOS within a few tokens."""
    from playground.tiny_models import build_tiny_lm

    return build_tiny_lm(seed=1, eos_bias=2.5)
