"""The picker's "On this computer…" dialog (issue 34, point 2): the stores' models as rows with their figures, one
that does not fit marked with why, one that cannot be opened greyed and not loadable, the filter, the dtype the
memory is at, and a choice that reaches the picker as a load request at that dtype."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PySide6.QtCore import QSettings, Qt
from test_stores import _sparse_model, _write_small_gguf

from playground.ui.dialogs.local_models import COLUMNS, LocalModelsDialog
from playground.ui.model_picker import ModelPicker

TINY = Path(".lmstudio/models/someone/tiny-GGUF/tiny.Q8_0.gguf")


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("home")
    (home / TINY).parent.mkdir(parents=True)
    _write_small_gguf(home / TINY)
    free = next(int(line.split()[1]) * 1024 for line in Path("/proc/meminfo").read_text().splitlines()
                if line.startswith("MemAvailable:"))
    _sparse_model(home / "mine" / "huge", int(free * 1.3 / 4 / 4096))  # float32: 1.3x the free RAM, bfloat16 0.65x
    (home / "mine" / "notes").mkdir()
    (home / "mine" / "notes" / "config.json").write_text(json.dumps({"model_type": "bert",
                                                                    "architectures": ["BertModel"]}))
    (home / "mine" / "notes" / "model.safetensors").write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")
    return home


def _rows(dialog: LocalModelsDialog) -> dict[str, list[str]]:
    return {item.text(0): [item.text(c) for c in range(len(COLUMNS))] for item in dialog._items()}


def test_the_dialog_lists_the_stores_and_loads_the_chosen_one_at_its_dtype(qtbot, home, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    for name in ("HF_HUB_CACHE", "HF_HOME", "OLLAMA_MODELS", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    picker = ModelPicker(QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat))
    qtbot.addWidget(picker)
    picker.device.setCurrentText("cpu")
    picker.dtype.setCurrentText("float32")
    flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")).split()
    offered = picker.dtype.itemData(picker.dtype.findText("bfloat16"), Qt.ItemDataRole.ToolTipRole)
    assert ("fast on this CPU" in offered) == ("avx512_bf16" in flags or "amx_bf16" in flags), offered
    dialog = picker.show_local_models()
    assert list(_rows(dialog)) == ["someone/tiny-GGUF/tiny.Q8_0.gguf"]  # no added folder yet
    dialog.add(str(home / "mine"))
    rows = _rows(dialog)
    assert set(rows) == {"someone/tiny-GGUF/tiny.Q8_0.gguf", "huge", "notes"}
    tiny = dict(zip(COLUMNS, rows["someone/tiny-GGUF/tiny.Q8_0.gguf"], strict=True))
    parameters = 300 * 64 + 64 * 64 + 96 * 64 + 64  # the tensors _write_small_gguf writes
    assert (tiny["store"], tiny["family"], tiny["quantization"], tiny["views"]) == ("LM Studio", "Llama", "Q8_0",
                                                                                  "every view")
    assert tiny["memory"] == f"{parameters * 4 / 1e3:.0f} KB" and tiny["parameters"] == f"{parameters / 1e3:.0f} K"
    assert rows["huge"][COLUMNS.index("memory")].endswith("(does not fit)")
    assert rows["notes"][COLUMNS.index("views")] == "none (cannot be opened here)"
    dialog.select_path(str(home / "mine" / "notes"))
    assert not dialog.load.isEnabled()  # BertModel is not a causal LM
    dialog.filter.setText("q8_0 lm")
    assert dialog.visible_paths() == [str(home / TINY)]
    dialog.filter.clear()
    dialog.dtype.setCurrentText("bfloat16")
    assert dialog.table.headerItem().text(COLUMNS.index("memory")) == "Memory (bfloat16)"
    assert _rows(dialog)["someone/tiny-GGUF/tiny.Q8_0.gguf"][COLUMNS.index("memory")] == \
        f"{parameters * 2 / 1e3:.0f} KB"
    assert _rows(dialog)["huge"][COLUMNS.index("memory")].count("(does not fit)") == 0  # 0.65x the free RAM
    dialog.select_path(str(home / TINY))
    with qtbot.waitSignal(picker.load_requested, timeout=2000) as asked:
        dialog.load.click()
    assert (asked.args[0].path, asked.args[0].dtype) == (str(home / TINY), "bfloat16")
    assert picker.dtype.currentText() == "bfloat16"
    dialog.remove(str(home / "mine"))
    assert list(_rows(dialog)) == ["someone/tiny-GGUF/tiny.Q8_0.gguf"]
