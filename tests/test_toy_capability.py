"""Adding a capability adds files and edits none: a toy capability from a package outside the playground
(tests/toy_capability: a strategy with its settings group, one event, a fold and a view), loaded by module name
through PLAYGROUND_CAPABILITIES, appears in the command line, the settings form, the docks, a saved run's round
trip and ``shot --view``, and no file of the playground names it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QImage
from windows import open_window

from playground.config import RunSettings
from playground.config.plugins import ENV

TESTS = Path(__file__).resolve().parent
PACKAGE = TESTS.parent / "playground"


def cli(*args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, ENV: "toy_capability", "PYTHONPATH": str(TESTS), "QT_QPA_PLATFORM": "offscreen",
           "XDG_CACHE_HOME": str(tmp_path / "cache")}
    return subprocess.run([sys.executable, "-m", "playground", *args], env=env, capture_output=True, text=True,
                          timeout=240)


def test_no_file_of_the_playground_names_the_toy():
    named = [p for p in PACKAGE.rglob("*.py") if "toy" in p.read_text(encoding="utf-8").lower()]
    assert named == []


def test_the_command_line_runs_it_saves_it_and_shoots_its_view(tmp_path, model_folder):
    help_text = cli("trace", "--help", tmp_path=tmp_path)
    assert help_text.returncode == 0, help_text.stderr
    assert "toy-echo" in help_text.stdout and "--toy-scale" in help_text.stdout

    trace = tmp_path / "toy.jsonl"
    ran = cli("trace", "--model", str(model_folder), "--strategy", "toy-echo", "--toy-scale", "3", "--prompt", "Hi",
              "--no-chat", "--max-new-tokens", "4", "--out", str(trace), tmp_path=tmp_path)
    assert ran.returncode == 0, ran.stderr
    events = [json.loads(line) for line in trace.read_text().splitlines()]
    tokens = [e for e in events if e["type"] == "token"]
    toys = [e for e in events if e["type"] == "toy_step"]
    assert len(tokens) == len(toys) == 4
    assert [t["length"] for t in toys] == [3 * len(t["text"]) for t in tokens]
    assert events[0]["settings"]["toy"]["toy_scale"] == 3

    out = tmp_path / "toy.png"
    shot = cli("shot", "--from-trace", str(trace), "--view", "toy", "--out", str(out), tmp_path=tmp_path)
    assert shot.returncode == 0, shot.stderr
    assert not QImage(str(out)).isNull()


def test_the_window_has_its_strategy_settings_and_dock_and_reopens_its_run(qtbot, tmp_path, tiny_lm, monkeypatch):
    monkeypatch.setenv(ENV, "toy_capability")
    w = open_window(qtbot, tmp_path, tiny_lm, RunSettings(max_new_tokens=5))
    names = [w.controls.strategy.itemText(i) for i in range(w.controls.strategy.count())]
    assert "toy-echo" in names and "toy" in w.controls.boxes and "toy" in w.docks

    w.controls.strategy.setCurrentText("toy-echo")
    assert w.controls.boxes["toy"].isEnabled()
    w.controls.widgets["toy_scale"].setValue(4)
    w.prompt.setPlainText("Hello")
    qtbot.mouseClick(w.generate_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not w.busy, timeout=20000)
    run = w.session.runs[-1]
    expected = sum(4 * len(step.text) for step in run.steps)
    assert w.views["toy"].label.text() == f"{len(run.steps)} toy steps, total length {expected}"

    path = w.save_run(tmp_path / "toy.jsonl")
    w.select_run(0)
    reopened = w.open_run(path)
    assert reopened is not None and reopened.status == run.status
    assert w.views["toy"].label.text() == f"{len(run.steps)} toy steps, total length {expected}"


@pytest.fixture(autouse=True)
def _forget_the_toy():
    """The toy registers itself in process-wide tables; later tests must not see it."""
    yield
    from playground.config import GROUPS
    from playground.config.catalog import STRATEGIES
    from playground.config.plugins import _LOADED, UI_MODULES
    from playground.events import EVENT_TYPES

    GROUPS.pop("toy", None)
    STRATEGIES.pop("toy-echo", None)
    EVENT_TYPES.pop("toy_step", None)
    if "toy_capability.view" in UI_MODULES:
        UI_MODULES.remove("toy_capability.view")
    if "toy_capability" in _LOADED:
        _LOADED.remove("toy_capability")
    try:
        from playground.ui.views import unregister_view

        unregister_view("toy")
    except ImportError:
        pass
    for name in [m for m in sys.modules if m.startswith("toy_capability")]:
        del sys.modules[name]
