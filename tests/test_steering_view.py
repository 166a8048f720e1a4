"""The steering view, the strength sweep and the live slider, against references computed here.

- The view's heat map holds the residual's projection onto the vector's unit direction, its table the chosen token's
  steered and unsteered probability and the KL, its slider label the strength relative to the residual norm: each
  compared with a hand-written hook on the tiny model's decoder block (records the block's output, then adds
  strength × direction), live and from a saved run; without --steer-compare it says how to turn the comparison on.
- The sweep: each pane's tokens are greedy under the hand-written hook at its strength; its mean KL and its
  perplexity under the unsteered model (table cells and figures) are computed here with NumPy.
- In the real window (one for the module; step mode holds the run at a step): moving the slider sets the running
  run's strength, the next token's ``steer`` event records it, and the text marks the change with a tooltip old → new.
- The steering field's Build… dialog builds a vector as the window's job (the mean difference computed here from
  ``output_hidden_states``), puts it into the field, and Stop saves nothing.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PySide6.QtCore import Qt
from PySide6.QtTest import QTest
from windows import let_go, open_window

from playground.config import RunSettings
from playground.engine.steering.build import ContrastSet, build_vector
from playground.engine.steering.files import save_vector
from playground.engine.strategies import run_strategy
from playground.events import RunStarted, TokenStep
from playground.events.panes import PaneFinished
from playground.events.steering import SteerStep
from playground.state import Run
from playground.traces import read_trace, write_trace
from playground.ui.style import format_percent
from playground.ui.views.steering import SteeringSweepView, SteeringView
from playground.ui.views.steering.sweep import ROWS

PROMPT = "The cat sat on"
STRENGTH = 2.0
WAIT_MS = 30000


@pytest.fixture(scope="module")
def vector(tiny_lm, tmp_path_factory):
    built = build_vector(tiny_lm, ContrastSet.pair("happy", "sad"))
    return built, save_vector(built, tmp_path_factory.mktemp("steer") / "happy.safetensors")


def settings(path, **extra) -> RunSettings:
    values = {"strategy": "greedy", "prompt": PROMPT, "chat": False, "max_new_tokens": 6,
              "steer": (f"{path}:{STRENGTH}",), **extra}
    return RunSettings.from_flat(**values)


@pytest.fixture(scope="module")
def events(tiny_lm, vector):
    return list(run_strategy(tiny_lm, settings(vector[1], steer_compare=True)))


class HandHook:
    """Block N's output recorded (before the add), then strength × direction added: the reference steering."""

    def __init__(self, lm, vector, strength: float) -> None:
        self.lm, self.vector, self.strength = lm, vector, strength
        self.seen: dict[int, torch.Tensor] = {}

    def __enter__(self):
        blocks = self.lm.model.model.layers
        self.handles = [blocks[n].register_forward_hook(self._hook(n)) for n in self.vector.directions]
        return self

    def _hook(self, n: int):
        direction = torch.from_numpy(self.vector.directions[n])

        def hook(module, args, output):
            h = output[0] if isinstance(output, tuple) else output
            self.seen[n] = h[0].detach().clone()
            h = h + self.strength * direction
            return (h, *output[1:]) if isinstance(output, tuple) else h
        return hook

    def __exit__(self, *exc) -> None:
        for handle in self.handles:
            handle.remove()


def forward(lm, ids, hook: HandHook | None = None) -> np.ndarray:
    """Log-probabilities [positions, vocab] of the model (steered inside ``hook``) over ``ids``."""
    with torch.no_grad():
        if hook is None:
            logits = lm.model(torch.tensor([ids])).logits[0]
        else:
            with hook:
                logits = lm.model(torch.tensor([ids])).logits[0]
    return torch.log_softmax(logits.double(), dim=-1).numpy()


def reference(lm, vector, prompt_ids, token_ids, strength=STRENGTH):
    """Per generated token: projections [blocks, tokens], steered and unsteered probability, KL; and the prompt's
    median residual norm per block over its positions after the first (NumPy's median)."""
    ids = [*prompt_ids, *token_ids]
    hook = HandHook(lm, vector, strength)
    steered = forward(lm, ids, hook)
    unsteered = forward(lm, ids)
    rows = slice(len(prompt_ids) - 1, len(ids) - 1)  # the positions that predicted the tokens
    chosen = np.array(token_ids)
    p_s = np.exp(steered[rows][np.arange(len(chosen)), chosen])
    p_u = np.exp(unsteered[rows][np.arange(len(chosen)), chosen])
    kl = (np.exp(steered[rows]) * (steered[rows] - unsteered[rows])).sum(axis=1)
    layers = sorted(vector.directions)
    units = {n: vector.directions[n] / np.linalg.norm(vector.directions[n]) for n in layers}
    projections = np.stack([hook.seen[n][rows].numpy() @ units[n] for n in layers])
    norms = {n: float(np.median(np.linalg.norm(hook.seen[n][1 : len(prompt_ids)].double().numpy(), axis=-1)))
             for n in layers}
    return projections, p_s, p_u, kl, norms


class _KeepOpen:
    """Stands in for qtbot when opening the module's window: qtbot would close it after the first test."""

    @staticmethod
    def addWidget(_widget) -> None:
        pass


@pytest.fixture(scope="module")
def shared_window(qapp, tiny_lm, vector, tmp_path_factory):
    """One window for the module (a window costs over half a second of CPU to build): its steering views show the
    runs of the view tests, its slider steers a run, its steering field builds a vector."""
    w = open_window(_KeepOpen, tmp_path_factory.mktemp("steer-window"), tiny_lm, settings(vector[1]),
                    size=(1400, 900))
    yield w
    let_go(w)
    w.close()
    w.deleteLater()


@pytest.fixture
def window(qtbot, shared_window):
    let_go(shared_window)  # a case that failed mid-run leaves no job to the next one
    assert not shared_window.busy
    yield shared_window
    let_go(shared_window)


@pytest.fixture
def view(window) -> SteeringView:
    v = window.views["steering"]
    v.reset()
    return v


def percent(text: str) -> float:
    return float(text.rstrip("%")) / 100


def shown(prob: float) -> float:
    """How far a percentage as shown may be from ``prob`` (half its last digit, and a little for the numerics)."""
    return 6e-4 if prob >= 0.01 else 6e-5


def check_view(view: SteeringView, lm, vector, events) -> None:
    built, _ = vector
    prompt_ids = next(e for e in events if isinstance(e, RunStarted)).prompt_token_ids
    tokens = [e.token_id for e in events if isinstance(e, TokenStep)]
    projections, p_s, p_u, kl, norms = reference(lm, built, prompt_ids, tokens)
    np.testing.assert_allclose(view.map.values, projections, rtol=1e-3, atol=1e-4)
    top = view.map.colorbar.levels()[1]
    assert top >= np.abs(projections).max() and view.map.colorbar.levels()[0] == -top  # centred on 0
    assert view.table.rowCount() == len(tokens)
    for row in range(len(tokens)):
        cells = [view.table.item(row, c).text() for c in range(view.table.columnCount())]
        assert cells[2] == f"{STRENGTH:+g}"
        assert percent(cells[3]) == pytest.approx(p_s[row], abs=shown(p_s[row]))
        assert percent(cells[4]) == pytest.approx(p_u[row], abs=shown(p_u[row]))
        assert float(cells[5]) == pytest.approx(kl[row], abs=2e-3)
    assert cells[3] == format_percent(next(e for e in events if isinstance(e, SteerStep) and e.step == row)
                                      .steered_prob)
    layer = max(norms)
    relative = STRENGTH * np.linalg.norm(built.directions[layer]) / norms[layer]
    assert f"{relative:.2f}× ‖h‖" in view.slider_value.text()
    assert f"{kl.mean():.4f}" in view.compare_note.text()
    assert "not recomputed" in view.cache_note.text()
    assert not view.slider.isEnabled()  # a finished (or saved) run takes no live strength


def test_the_view_shows_projections_probabilities_and_kl_live_and_saved(view, tiny_lm, vector, events, tmp_path):
    view.show_run(Run.from_events(events))
    check_view(view, tiny_lm, vector, events)
    saved = read_trace(write_trace(events, tmp_path / "steered.jsonl"))
    view.reset()
    view.show_run(Run.from_events(saved.events))
    check_view(view, tiny_lm, vector, events)
    assert not view.grab().toImage().isNull()


def test_without_the_comparison_the_view_says_how_to_turn_it_on(view, tiny_lm, vector):
    plain = list(run_strategy(tiny_lm, settings(vector[1], max_new_tokens=2)))
    view.show_run(Run.from_events(plain))
    note = view.compare_note.text()
    assert "--steer-compare" in note and "one more forward pass" in note
    assert not view.tabs.isTabVisible(1) and not view.tabs.isTabVisible(2)
    assert view.table.item(0, 3).text() == "—"


def test_the_sweep_panes_their_mean_kl_and_perplexity(window, tiny_lm, vector):
    built, path = vector
    strengths = (-4.0, 3.0)
    sweep = list(run_strategy(tiny_lm, settings(path, steer_sweep="-4, 3")))
    prompt_ids = next(e for e in sweep if isinstance(e, RunStarted)).prompt_token_ids
    finished = [e for e in sweep if isinstance(e, PaneFinished)]
    assert [e.figures["strength"] for e in finished] == [0.0, *strengths]
    view = window.views["steering-sweep"]
    assert isinstance(view, SteeringSweepView)
    view.reset()
    view.show_run(Run.from_events(sweep))
    rows = {key: i for i, (key, _, _) in enumerate(ROWS)}
    for pane, strength in enumerate((0.0, *strengths)):
        ids = list(prompt_ids)
        for _ in range(6):  # greedy under the hand-written hook at the pane's strength
            ids.append(int(forward(tiny_lm, ids, HandHook(tiny_lm, built, strength))[-1].argmax()))
        tokens = ids[len(prompt_ids):]
        assert list(finished[pane].token_ids) == tokens
        _, _, p_u, kl, _ = reference(tiny_lm, built, prompt_ids, tokens, strength)
        perplexity = float(np.exp(-np.log(p_u).mean()))
        assert finished[pane].figures["mean_kl"] == pytest.approx(kl.mean(), abs=1e-5)
        assert finished[pane].figures["perplexity"] == pytest.approx(perplexity, rel=1e-5)
        assert view.table.item(rows["mean_kl"], pane).text() == f"{kl.mean():.4f}"
        assert float(view.table.item(rows["perplexity"], pane).text()) == pytest.approx(perplexity, abs=0.006)
        assert f"{kl.mean():.4f}" in view.panes.columns[pane].figures.text()
    assert view.table.horizontalHeaderItem(1).text() == "strength -4"
    assert kl.mean() > 0 and finished[0].figures["mean_kl"] == 0.0


def test_the_slider_sets_the_running_runs_strength_and_the_text_marks_it(qtbot, window, vector):
    _, path = vector
    w = window
    w.set_run_settings(settings(path))
    try:
        w.step_mode.setChecked(True)
        w.generate()
        bar = w.views["tokens"].step_bar
        for step in (0, 1):  # the sampler's own pick (Space) at steps 0 and 1
            qtbot.waitUntil(lambda step=step: bar.waiting and bar.step.step == step, timeout=WAIT_MS)
            QTest.keyClick(bar, Qt.Key.Key_Space)
        qtbot.waitUntil(lambda: bar.waiting and bar.step.step == 2, timeout=WAIT_MS)
        view = w.views["steering"]
        assert view.slider.isEnabled()
        view.set_slider_strength(-3.0)  # what dragging the slider there does
        assert w.live_strength is not None and w.live_strength.strengths((STRENGTH,)) == (-3.0,)
        bar.run_on_button.click()
        qtbot.waitUntil(lambda: not w.busy, timeout=WAIT_MS)
        run = w.session.selected
        steps = [e for e in run.events if isinstance(e, SteerStep)]
        assert [s.strengths for s in steps] == [(STRENGTH,)] * 3 + [(-3.0,)] * 3  # step 2's pass came before
        assert [s.changed for s in steps] == [False, False, False, True, False, False]
        assert list(view.text.changes) == ["change:3"]
        document = view.text.toPlainText()
        tokens = [e.text for e in run.events if isinstance(e, TokenStep)]
        assert document.startswith("".join(tokens[:3]) + "▶-3")
        cursor = view.text.textCursor()
        cursor.setPosition(len("".join(tokens[:3])) + 1)
        point = view.text.cursorRect(cursor).center()
        tip = view.text.tooltip_at(point.x(), point.y())
        assert "+2 → -3" in tip and "not recomputed" in tip
        assert "1 live change" in view.header.text()
        assert not view.slider.isEnabled()
    finally:
        let_go(w)
        w.step_mode.setChecked(False)


# --- building a vector in the window ----------------------------------------------------------------------------
def fill(dialog, contrast: str, method: str, layers: str, out) -> None:
    dialog.contrast.setCurrentText(contrast)
    dialog.method.setCurrentText(method)
    dialog.layers.setText(layers)
    dialog.out.setText(str(out))


def last_token_states(lm, texts, block: int) -> np.ndarray:
    """hidden_states[block + 1] (block ``block``'s output) at each text's last token, [texts, hidden]."""
    rows = []
    for text in texts:
        with torch.inference_mode():
            out = lm.model(torch.tensor([lm.tokenizer(text)["input_ids"]]), output_hidden_states=True)
        rows.append(out.hidden_states[block + 1][0, -1].double().numpy())
    return np.stack(rows)


def test_the_build_dialog_builds_off_the_gui_thread_fills_the_field_and_stops(qtbot, window, tiny_lm, tmp_path):
    """The steering field's Build… opens the dialog; its build is the window's one job (Generate waits), its file
    goes into the field after what was there and equals the mean difference computed here; Stop saves nothing."""
    import json

    from playground.engine.steering.contrast_sets import SETS_DIR, load_contrast_set
    from playground.engine.steering.files import load_vector

    w = window
    field = w.controls.steer_field()
    field.set_specs(("other.gguf:2",))
    field.build_button.click()
    dialog = w.steer_build_dialog
    assert dialog is not None and dialog.isVisible()
    try:
        fill(dialog, "happy-sad", "mean", "0-1", tmp_path / "bad.gguf")  # bad input: said, no job
        dialog.build_button.click()
        assert "llama.cpp never steers block 0" in dialog.message.text() and w.job is None

        out = tmp_path / "happy.safetensors"
        fill(dialog, "happy-sad", "mean", "0-0", out)
        dialog.build_button.click()
        assert w.busy and not w.generate_button.isEnabled()  # the window's one job
        assert dialog.stop_button.isEnabled() and not dialog.build_button.isEnabled()
        qtbot.waitUntil(lambda: not w.busy, timeout=WAIT_MS)
        assert dialog.written == out and "Saved" in dialog.message.text() and dialog.progress.value() == 1000
        assert field.specs() == ("other.gguf:2", str(out))
        contrast = load_contrast_set("happy-sad").contrast
        pos, neg = last_token_states(tiny_lm, contrast.positive, 0), last_token_states(tiny_lm, contrast.negative, 0)
        made = load_vector(out)
        assert made.layers == (0,) and made.method == "mean-diff"
        np.testing.assert_allclose(made.directions[0], pos.mean(0) - neg.mean(0), rtol=1e-4, atol=1e-5)

        # Stop: a long set stopped at its first progress report; nothing saved, the field as it was
        many = tmp_path / "many.json"
        spec = json.loads((SETS_DIR / "happy-sad.json").read_text())
        spec["positive"], spec["negative"] = spec["positive"] * 100, spec["negative"] * 100
        many.write_text(json.dumps(spec))
        stopped = tmp_path / "stopped.safetensors"
        fill(dialog, str(many), "mean", "", stopped)
        dialog.build_button.click()
        qtbot.waitUntil(lambda: dialog.progress.value() > 0 or not w.busy, timeout=WAIT_MS)
        dialog.stop_button.click()
        qtbot.waitUntil(lambda: not w.busy, timeout=WAIT_MS)
        assert not stopped.exists() and "Stopped: nothing was saved" in dialog.message.text()
        assert field.specs() == ("other.gguf:2", str(out)) and dialog.build_button.isEnabled()
    finally:
        dialog.close()
