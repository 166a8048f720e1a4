"""Where the playground keeps its files: the user cache (respects XDG_CACHE_HOME)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "decoding-playground"


def models_dir() -> Path:
    return cache_root() / "models"


def steering_dir() -> Path:
    """Where the window's "Build steering vector" dialog saves a vector unless told otherwise."""
    return cache_root() / "steering"
