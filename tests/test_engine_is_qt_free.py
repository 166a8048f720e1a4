"""The engine and the Qt-free core never import Qt; importing the package loads neither torch nor Qt."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import playground.engine
import playground.models

# Every engine and model module (new ones are covered automatically), plus the Qt-free core.
ENGINE_MODULES = [
    info.name for package in (playground.engine, playground.models)
    for info in pkgutil.walk_packages(package.__path__, prefix=package.__name__ + ".")
] + ["playground.events", "playground.config", "playground.state", "playground.state.beam_tree", "playground.cli"]


def _loaded_after(code: str) -> set[str]:
    probe = f"{code}\nimport sys\nprint(' '.join(sorted(m.split('.')[0] for m in sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_engine_imports_no_qt():
    loaded = _loaded_after("\n".join(f"import {m}" for m in ENGINE_MODULES))
    assert "torch" in loaded  # the import really happened
    assert not {"PySide6", "pyqtgraph", "shiboken6"} & loaded


def test_package_import_is_light():
    loaded = _loaded_after("import playground")
    assert not {"torch", "PySide6", "transformers"} & loaded
