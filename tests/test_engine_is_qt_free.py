"""The engine and the Qt-free core never import Qt, even while running a strategy; importing the package loads
neither torch nor Qt; reading the strategy registry, settings and saved runs loads no torch."""

from __future__ import annotations

import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import playground
import playground.config
import playground.engine
import playground.events
import playground.models
import playground.state

ROOT = Path(__file__).resolve().parent.parent
QT = {"PySide6", "pyqtgraph", "shiboken6"}
QT_FREE_PACKAGES = (playground.engine, playground.models, playground.events, playground.config, playground.state)
# Every module of those packages (new ones are covered automatically), plus the Qt-free top-level modules.
QT_FREE_MODULES = [
    info.name for package in QT_FREE_PACKAGES
    for info in pkgutil.walk_packages(package.__path__, prefix=package.__name__ + ".")
] + ["playground.cli", "playground.cli_options", "playground.presets", "playground.traces", "support.tiny_models"]


def _loaded_after(code: str) -> set[str]:
    probe = f"{code}\nimport sys\nprint('LOADED', ' '.join(sorted(m.split('.')[0] for m in sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT / "tests")})  # tests/support importable
    line = next(line for line in out.stdout.splitlines() if line.startswith("LOADED "))
    return set(line.split()[1:])


def test_the_walk_covers_every_package():
    walked = {name.rsplit(".", 1)[0] for name in QT_FREE_MODULES}
    assert {"playground.engine", "playground.events", "playground.config", "playground.state"} <= walked
    assert "playground.engine.beam" in QT_FREE_MODULES and "playground.state.beam_tree" in QT_FREE_MODULES


def test_engine_imports_no_qt_even_while_running_every_strategy():
    run_all = """
from playground.config import RunSettings
from playground.config.catalog import STRATEGIES
from playground.engine.strategies import run_strategy
from support.strategy_needs import NEEDS
from support.tiny_models import build_tiny_lm
lm = build_tiny_lm(seed=0)
for name in STRATEGIES:
    settings = RunSettings.from_flat(strategy=name, prompt="Hello", max_new_tokens=3, **NEEDS.get(name, {}))
    events = list(run_strategy(lm, settings))
    assert events[-1].type == "done", name
"""
    loaded = _loaded_after("\n".join(f"import {m}" for m in QT_FREE_MODULES) + run_all)
    assert "torch" in loaded  # the imports and the runs really happened
    assert not QT & loaded


def test_package_import_is_light():
    loaded = _loaded_after("import playground")
    assert not {"torch", "PySide6", "transformers"} & loaded


def test_settings_registry_and_saved_runs_load_no_torch():
    loaded = _loaded_after("import playground.config.catalog, playground.config.words, playground.engine.strategies, "
                           "playground.traces, playground.presets, playground.state, playground.cli_options")
    assert not {"torch", "transformers", *QT} & loaded
