"""The layering holds: the import-linter contracts in pyproject.toml ([tool.importlinter]) are all kept.

Bottom first: the contract (events, config with the strategy catalog, errors) -> models -> engine -> remote -> files
(presets, saved runs) -> state -> ui -> the command line; state, remote and files never import the engine; the
engine imports neither Qt nor the command line; no circles inside a package. Lazy imports count.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_the_import_contracts_are_kept():
    lint_imports = Path(sys.executable).parent / "lint-imports"  # the test extra's import-linter, in this venv
    assert lint_imports.exists(), "install the test extra: pip install -e '.[test]' (import-linter)"
    out = subprocess.run([str(lint_imports), "--no-cache", "--no-logo"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    report = out.stdout + out.stderr
    if out.returncode != 0:
        pytest.fail(f"an import runs against the layering (pyproject.toml [tool.importlinter]):\n{report}",
                    pytrace=False)
    assert "0 broken" in report, report


def test_every_error_meant_for_the_user_is_a_user_error():
    """The bottom layer gathers them by their base class, without importing the layers that raise them."""
    from playground.config import ConfigError
    from playground.errors import USER_ERRORS, ScreenshotError
    from playground.models.default_model import FetchCancelled, FetchError
    from playground.models.loading import ModelLoadError, RemoteCodeRefused
    from playground.remote.errors import RemoteError
    from playground.traces import TraceError

    for error in (ConfigError, ModelLoadError, RemoteCodeRefused, FetchError, FetchCancelled, ScreenshotError,
                  TraceError, RemoteError):
        assert issubclass(error, USER_ERRORS), error
