"""Every family in the window: the status bar names the family and what it supports, the form greys out what a
model cannot run, and every strategy runs live on each family's tiny model and reopens from its saved run in every
view without an exception (pytest-qt fails a test on any exception raised in a slot or a paint)."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from support.tiny_models import FAMILIES, build_tiny_lm, build_tokenizer
from windows import let_go, open_window

from playground.config import LensSettings, RunSettings
from playground.models.anatomy import anatomy_of
from playground.models.loaded import LoadedModel
from playground.ui.main_window import MainWindow

RUN_TIMEOUT_MS = 30000
# One run of each strategy that opens the model up, and the plain ones, a few tokens each.
RUNS = (
    {"strategy": "greedy", "lens": True},
    {"strategy": "sample", "seed": 1},
    {"strategy": "beam", "num_beams": 2},
    {"strategy": "early-exit", "min_exit_layer": 2},
    {"strategy": "layer-skip", "skip_layers": "3"},
    {"strategy": "speculative", "draft": "layers", "draft_layers": 2, "draft_k": 3},
    {"strategy": "cascade", "cheap": "layers", "cheap_layers": 2},
    {"strategy": "kv-cache"},
    {"strategy": "greedy", "quant": "awq", "compare": True, "calibration_tokens": 64},
    {"strategy": "compare", "panes": ("greedy", "early-exit --min-exit-layer 2")},
    {"strategy": "contrastive", "amateur": "layer", "amateur_layer": 2},
)


def make_window(qtbot, tmp_path, lm: LoadedModel) -> MainWindow:
    return open_window(qtbot, tmp_path, lm, RunSettings(max_new_tokens=5))


def generate(qtbot, w: MainWindow, flat: dict) -> None:
    w.controls.set_run_settings(RunSettings.from_flat(prompt="", max_new_tokens=5, chat=False, **flat))
    w.prompt.setPlainText("The capital of France is Paris. The weather")
    qtbot.mouseClick(w.generate_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not w.busy, timeout=RUN_TIMEOUT_MS)


class _KeepOpen:
    """Stands in for qtbot when opening the module's window: qtbot would close it after the first test."""

    @staticmethod
    def addWidget(_widget) -> None:
        pass


@pytest.fixture(scope="module")
def families_window(qapp, tmp_path_factory):
    """One window for every family, each family's model loaded into it in turn (as a user switches models; a window
    opened with a model gets it the same way, ``set_model`` after ``show``). The suite's time: a window costs over a
    second of CPU to build."""
    w = open_window(_KeepOpen, tmp_path_factory.mktemp("families-window"), None, RunSettings(max_new_tokens=5))
    yield w
    let_go(w)
    w.close()
    w.deleteLater()


@pytest.mark.parametrize("family", FAMILIES)
def test_every_strategy_runs_live_and_reopens_saved_on_each_family(qtbot, tmp_path, families_window, family):
    lm = build_tiny_lm(seed=2, layers=4, family=family)
    w = families_window
    let_go(w)  # a family that failed mid-run leaves no job to the next one
    assert not w.busy
    w.set_model(lm)
    label = w.status.labels["family"]
    assert label.text() == f"{anatomy_of(lm.model).family}: every view supported"
    assert "logit lens: supported" in label.toolTip()
    for i, flat in enumerate(RUNS):
        generate(qtbot, w, flat)
        run = w.session.runs[-1]
        assert run.status in ("max_new_tokens", "eos", "context_full"), (flat, run.status, w.banner.label.text())
        assert run.settings.strategy == flat["strategy"]
        path = w.save_run(tmp_path / f"{i}.jsonl")
        reopened = w.open_run(path)
        assert reopened is not None and reopened.status == run.status
        assert reopened.generated_ids == run.generated_ids


def unknown_family_lm() -> LoadedModel:
    """A real causal LM of a family the anatomy table has no row for (BLOOM)."""
    import torch
    from transformers import BloomConfig, BloomForCausalLM

    tokenizer = build_tokenizer()
    config = BloomConfig(vocab_size=len(tokenizer), hidden_size=16, n_layer=2, n_head=2,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    model = BloomForCausalLM(config).eval()
    return LoadedModel(model=model, tokenizer=tokenizer, name="tiny-bloom", path="<memory>",
                       device=torch.device("cpu"), dtype=torch.float32)


def test_a_family_without_a_table_row_is_named_and_its_capabilities_greyed_out(qtbot, tmp_path):
    w = make_window(qtbot, tmp_path, unknown_family_lm())
    label = w.status.labels["family"]
    assert label.text() == "bloom: 4 of 5 capabilities need another family"
    assert "early exit and layer skip: not supported — the BloomForCausalLM family ('bloom')" in label.toolTip()
    assert "KV lab: supported" in label.toolTip()  # it needs only the config's KV geometry
    generate(qtbot, w, {"strategy": "kv-cache"})  # and it runs
    assert w.session.runs[-1].status in ("max_new_tokens", "eos")
    items = w.controls.strategy.model()
    names = [w.controls.strategy.itemText(i) for i in range(w.controls.strategy.count())]
    for name in ("early-exit", "layer-skip"):
        assert not items.item(names.index(name)).isEnabled()
    assert items.item(names.index("greedy")).isEnabled()
    w.controls.strategy.setCurrentText("greedy")
    assert not w.controls.boxes["lens"].isEnabled() and "not for this model" in w.controls.boxes["lens"].toolTip()
    assert not w.controls.boxes["quant"].isEnabled()
    # Greedy still runs, and a lens ticked before cannot sneak into the run's settings.
    w.controls.widgets["lens"].setChecked(True)
    generate(qtbot, w, {"strategy": "greedy"})
    run = w.session.runs[-1]
    assert run.status in ("max_new_tokens", "eos") and not run.settings.group(LensSettings).lens

    # Loading a supported family afterwards lifts every limit.
    w.set_model(build_tiny_lm(seed=0, family="gpt2"))
    assert items.item(names.index("early-exit")).isEnabled()
    assert label.text() == "GPT-2: every view supported"
