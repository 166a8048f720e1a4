"""The main window driven like a user would, on tiny random models and the real engine (pytest-qt, offscreen)."""

from __future__ import annotations

import time

import numpy as np
import pytest
from PySide6.QtCore import QPoint, QPointF, QRect, Qt
from PySide6.QtGui import QImage, QTextCursor
from windows import let_go, open_window, top_level_ids, windows_opened_since

from playground.config import ModelSettings, RunSettings
from playground.state import chart_rows, flowing_token_text
from playground.ui.main_window import MainWindow
from playground.ui.model_picker import recent_models
from playground.ui.style import shade_for_prob
from playground.ui.views.tokens.candidates import MAX_ROWS
from playground.ui.views.tokens.tooltip import token_tooltip_html

RUN_TIMEOUT_MS = 20000


@pytest.fixture(scope="module")
def long_lm():
    """A tiny model with a long context, for runs that must still be going when we stop them."""
    from support.tiny_models import build_tiny_lm

    return build_tiny_lm(seed=0, max_positions=4096)


@pytest.fixture
def window(qtbot, tiny_lm, tmp_path):
    w = open_window(qtbot, tmp_path, tiny_lm, RunSettings(max_new_tokens=12))
    yield w
    let_go(w, 5000)


def tokens(w: MainWindow):
    return w.views["tokens"]


def showing(w: MainWindow, name: str) -> bool:
    """The dock of view ``name`` shows the view (not its "nothing to show" message)."""
    return w.docks[name].pages.currentWidget() is w.views[name]


def generate(qtbot, w: MainWindow) -> None:
    qtbot.mouseClick(w.generate_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not w.busy, timeout=RUN_TIMEOUT_MS)


def start_long_run(qtbot, w: MainWindow, lm, min_steps: int) -> None:
    """Start a 3000-token run on ``lm`` and wait until it has made ``min_steps`` steps (it is still going)."""
    w.set_model(lm)
    w.controls.widgets["max_new_tokens"].setValue(3000)
    qtbot.mouseClick(w.generate_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: len(w.session.runs[0].steps) >= min_steps, timeout=RUN_TIMEOUT_MS)


def test_generate_fills_token_view_chart_and_status(qtbot, window):
    w = window
    w.controls.strategy.setCurrentText("sample")
    w.controls.widgets["temperature"].setValue(0.7)
    w.controls.widgets["top_k"].setValue(5)
    w.controls.widgets["max_new_tokens"].setValue(10)
    generate(qtbot, w)

    run = w.session.runs[0]
    assert run.error is None and run.finished is not None
    assert run.settings.strategy == "sample" and run.settings.temperature == 0.7 and run.settings.top_k == 5
    assert tokens(w).token_view.steps == run.steps and len(run.steps) == len(run.finished.token_ids)
    doc = tokens(w).token_view.text.toPlainText()
    assert doc.startswith(run.started.prompt_text)
    assert all(flowing_token_text(s.text) in doc for s in run.steps)

    step = tokens(w).chart.step
    assert step in run.steps
    assert tokens(w).chart.rows == chart_rows(step, MAX_ROWS)
    raw_widths = list(tokens(w).chart._raw.opts["width"])
    assert np.allclose(raw_widths, [r.raw_prob * 100 for r in tokens(w).chart.rows])
    cut = [r for r in tokens(w).chart.rows if r.cut_by]
    assert cut and all(r.cut_by == "top_k" for r in cut)  # top-k 5 of 10 shown candidates
    assert len(tokens(w).chart._cut.opts["width"]) == len(cut)
    labels = [label.toPlainText() for label in tokens(w).chart._labels if label.isVisible()]
    assert "cut by top_k" in labels
    ticks = tokens(w).chart.plot.getPlotItem().getAxis("left")._tickLevels[0]
    assert sum(1 for _, text in ticks if text.startswith("▶ ")) == 1

    status = " ".join(label.text() for label in w.status.labels.values())
    assert "tokens/s" in status and "tiny-llama-0" in status and "prefill" in status and "cpu" in status
    assert w.runs_list.count() == 1 and "#1 sample" in w.runs_list.item(0).text()
    assert w.generate_button.isEnabled() and not w.stop_button.isEnabled()


def test_click_a_token_then_step_with_the_keyboard(qtbot, window):
    w = window
    generate(qtbot, w)
    view = tokens(w).token_view.text
    cursor = QTextCursor(view.document())
    cursor.setPosition(view._starts[1])
    point = view.cursorRect(cursor).center() + QPoint(3, 0)
    assert view.step_at(point) == 1
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=point)
    assert tokens(w).chart.step.step == 1 and tokens(w).chart_index == 1
    qtbot.keyClick(view, Qt.Key.Key_Right)
    assert tokens(w).chart.step.step == 2
    qtbot.keyClick(view, Qt.Key.Key_Left)
    qtbot.keyClick(view, Qt.Key.Key_Left)
    assert tokens(w).chart.step.step == 0

    # Shading follows the chosen distribution.
    steps = w.session.runs[0].steps
    tokens(w).token_view.mode.setCurrentIndex(1)
    cursor.setPosition(view._starts[0] + 1)
    assert cursor.charFormat().background().color() == shade_for_prob(steps[0].prob)
    tokens(w).token_view.mode.setCurrentIndex(0)
    cursor.setPosition(view._starts[0] + 1)
    assert cursor.charFormat().background().color() == shade_for_prob(steps[0].raw_prob)
    assert "raw model" in tokens(w).token_view.caption.text()

    tip = token_tooltip_html(w.session.runs[0].steps[1])
    assert "rest of vocabulary" in tip and "log-prob" in tip and "cover" in tip and "%" in tip


def test_branching_creates_a_run_that_starts_with_the_forced_prefix(qtbot, window):
    w = window
    generate(qtbot, w)
    parent = w.session.runs[0]
    tokens(w).show_chart_step(2)
    row = next(i for i, r in enumerate(tokens(w).chart.rows) if not r.chosen and r.token_id is not None)
    alt = tokens(w).chart.rows[row].token_id

    # Double-click the alternative's bar in the chart.
    view = tokens(w).chart.plot.getPlotItem().getViewBox()
    scene_point = view.mapViewToScene(QPointF(0.3, row))
    widget_point = tokens(w).chart.plot.mapFromScene(scene_point)
    for _ in range(2):  # QTest's mouseDClick sends no press/release, which pyqtgraph's scene needs
        qtbot.mouseClick(tokens(w).chart.plot.viewport(), Qt.MouseButton.LeftButton, pos=widget_point)
    qtbot.waitUntil(lambda: len(w.session.runs) == 2 and not w.busy, timeout=RUN_TIMEOUT_MS)

    child = w.session.runs[1]
    assert child.generated_ids[:3] == (*parent.generated_ids[:2], alt)
    assert child.branch is not None and child.branch.parent == 0 and child.branch.step == 2
    assert w.session.selected is child and tokens(w).token_view.steps == child.steps
    assert w.runs_list.count() == 2 and "branch of #1" in w.runs_list.item(1).text()

    # The original stays reachable from the runs list.
    item_rect = w.runs_list.visualItemRect(w.runs_list.item(0))
    qtbot.mouseClick(w.runs_list.viewport(), Qt.MouseButton.LeftButton, pos=item_rect.center())
    assert w.session.selected is parent and tokens(w).token_view.steps == parent.steps

    # Branching from the token's context menu.
    menu = tokens(w).token_view.text.alternatives_menu(0)
    action = next(a for a in menu.actions() if not a.isSeparator() and a.text())
    action.trigger()
    qtbot.waitUntil(lambda: len(w.session.runs) == 3 and not w.busy, timeout=RUN_TIMEOUT_MS)
    assert w.session.runs[2].steps[0].forced and w.session.runs[2].branch.step == 0


def test_stop_ends_the_run_within_one_token(qtbot, window, long_lm, monkeypatch):
    """Stop is honoured before the engine's next step: at most the step in flight arrives after it."""
    import playground.engine.strategies as strategies

    produced = []  # engine steps yielded so far (appended on the worker thread)
    real_run_strategy = strategies.run_strategy

    def counting(lm, settings, should_stop=None, progress=None, chooser=None):
        for event in real_run_strategy(lm, settings, should_stop, progress, chooser=chooser):
            if event.type == "token":
                produced.append(event.step)
            yield event

    monkeypatch.setattr(strategies, "run_strategy", counting)
    w = window
    w.prompt.setPlainText("Hello")
    start_long_run(qtbot, w, long_lm, 3)
    assert w.stop_button.isEnabled()
    qtbot.mouseClick(w.stop_button, Qt.MouseButton.LeftButton)
    at_stop = len(produced)
    qtbot.waitUntil(lambda: not w.busy, timeout=RUN_TIMEOUT_MS)
    run = w.session.runs[0]
    assert run.finished.stop_reason == "stopped"
    assert at_stop <= len(run.steps) <= at_stop + 1
    assert list(run.finished.token_ids) == [s.token_id for s in run.steps]
    assert w.generate_button.isEnabled()


def test_closing_mid_run_does_not_hang(qtbot, window, long_lm):
    w = window
    start_long_run(qtbot, w, long_lm, 2)
    job = w.job
    started = time.monotonic()
    assert w.close()
    assert time.monotonic() - started < 5
    assert not w.busy and job.thread.isFinished()


def test_bad_model_path_shows_a_message_and_the_window_stays_usable(qtbot, window, tmp_path):
    w = window
    w.load_model(ModelSettings(path=str(tmp_path / "no-such-model")))
    qtbot.waitUntil(lambda: not w.busy, timeout=RUN_TIMEOUT_MS)
    assert w.banner.isVisible() and w.banner.kind == "error"
    assert "no-such-model" in w.banner.label.text()
    assert w.lm is not None and w.lm.name == "tiny-llama-0"

    corrupt = tmp_path / "broken.gguf"
    corrupt.write_bytes(b"not a gguf file at all" * 10)
    w.load_model(ModelSettings(path=str(corrupt)))
    qtbot.waitUntil(lambda: not w.busy, timeout=RUN_TIMEOUT_MS)
    assert w.banner.kind == "error" and w.banner.isVisible()

    generate(qtbot, w)
    assert w.session.runs[0].finished is not None and not w.banner.isVisible()


def test_loading_a_model_folder_remembers_it(qtbot, window, tiny_lm, tmp_path):
    folder = tmp_path / "tiny"
    tiny_lm.model.save_pretrained(folder)
    tiny_lm.tokenizer.save_pretrained(folder)
    w = window
    w.load_model(ModelSettings(path=str(folder), device="cpu", dtype="float32"))
    qtbot.waitUntil(lambda: not w.busy, timeout=RUN_TIMEOUT_MS)
    assert not w.banner.isVisible(), w.banner.label.text()
    assert w.lm is not tiny_lm and w.lm.path.endswith("tiny")
    assert recent_models(w.store) == [str(folder)]
    assert w.picker.source.currentData() == str(folder)
    generate(qtbot, w)
    assert w.session.runs[0].finished is not None


def test_impossible_settings_and_too_long_prompts_are_explained(qtbot, window):
    w = window
    w.controls.strategy.setCurrentText("beam")
    w.controls.widgets["num_beams"].setValue(2)
    w.controls.widgets["num_return_sequences"].setValue(3)
    qtbot.mouseClick(w.generate_button, Qt.MouseButton.LeftButton)
    assert w.banner.kind == "error" and "num_return_sequences" in w.banner.label.text()
    assert not w.session.runs and not w.busy

    w.controls.strategy.setCurrentText("greedy")
    w.prompt.setPlainText("capital " * 400)  # far past the tiny model's 256 positions
    generate(qtbot, w)
    assert w.banner.kind == "error" and "shorten the prompt" in w.banner.label.text()
    assert w.session.runs[0].status == "failed" and "failed" in w.runs_list.item(0).text()

    w.prompt.setPlainText("capital")
    generate(qtbot, w)
    assert w.session.runs[1].finished is not None


def test_missing_default_model_offers_to_fetch_it(qtbot, window, monkeypatch):
    import playground.models.default_model as default_model

    monkeypatch.setattr(default_model, "is_default_model_ready", lambda: False)
    window.load_model(ModelSettings(path=None))
    assert window.banner.isVisible() and window.banner.kind == "info"
    assert window.banner.action.isVisible() and "Fetch" in window.banner.action.text()
    assert not window.busy


def changed_fraction(a: QImage, b: QImage) -> float:
    """Share of pixels whose grey level differs by more than 30 (of 255) between two pictures of one region."""
    def grey(image: QImage) -> np.ndarray:
        g = image.convertToFormat(QImage.Format.Format_Grayscale8)
        return np.frombuffer(g.constBits(), dtype=np.uint8).reshape(g.height(), g.bytesPerLine())[:, : g.width()]

    assert a.size() == b.size()
    return float((np.abs(grey(a).astype(float) - grey(b).astype(float)) > 30).mean())


def test_screenshots_show_the_output_and_the_chart(qtbot, window, tiny_lm, tmp_path):
    w = window
    view = tokens(w)
    before = view.grab().toImage()
    generate(qtbot, w)
    after = view.grab().toImage()

    def region(widget) -> QRect:
        return QRect(widget.mapTo(view, QPoint(0, 0)), widget.size())

    # The output gained the prompt and the shaded tokens; the chart gained bars and labels.
    for part in (view.token_view.text, view.chart.plot):
        assert changed_fraction(before.copy(region(part)), after.copy(region(part))) > 0.01

    from playground.ui.screenshot import render_screenshot

    out = render_screenshot(ModelSettings(), RunSettings(strategy="sample", max_new_tokens=8, top_p=0.9),
                            tmp_path / "shot.png", width=1200, height=800, lm=tiny_lm, hover=False)
    image = QImage(str(out))
    assert image.width() == 1200 and image.height() == 800
    empty = tmp_path / "empty.png"
    w.resize(1200, 800)
    w.session.selected = None
    idle = open_window(qtbot, tmp_path, run_settings=RunSettings(), size=(1200, 800), store=w.store)
    idle.grab().save(str(empty))
    assert changed_fraction(QImage(str(empty)), image) > 0.02


def test_beam_runs_go_to_the_beam_view(qtbot, window):
    w = window
    w.controls.strategy.setCurrentText("beam")
    w.controls.widgets["num_beams"].setValue(3)
    w.controls.widgets["max_new_tokens"].setValue(5)
    generate(qtbot, w)
    run = w.session.runs[0]
    assert run.error is None and run.step_events and run.finished.sequences
    assert showing(w, "beam") and not showing(w, "tokens")
    assert "has nothing for the tokens" in w.docks["tokens"].empty.text()
    tree = w.views["beam"].panel.tree
    assert tree.steps == len(run.step_events) == len([e for e in run.events if e.type == "beam_step"])
    assert "steps/s" in w.status.labels["speed"].text() and "—" not in w.status.labels["speed"].text()
    assert f"{len(run.step_events)} steps ·" in w.runs_list.item(0).text()

    # Preparing the next run must not hide the tree being looked at; the views follow the selected run.
    w.controls.strategy.setCurrentText("greedy")
    assert showing(w, "beam")
    generate(qtbot, w)
    assert showing(w, "tokens") and not showing(w, "beam")
    w.runs_list.setFocus()
    qtbot.keyClick(w.runs_list, Qt.Key.Key_Up)  # arrow keys pick runs like clicks do
    assert w.session.selected is run and showing(w, "beam") and tree.steps == len(run.step_events)


def test_launch_shows_load_failures_and_exits_cleanly(qtbot, qapp, tmp_path, monkeypatch):
    from PySide6.QtCore import QEventLoop, QTimer

    from playground.ui.app import launch

    # A real app.exec() here would leave the shared QApplication "closing" for the tests that follow.
    loop = QEventLoop()
    monkeypatch.setattr(qapp, "exec", loop.exec, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))  # keep the user's QSettings out of it
    seen = {}

    def check_then_quit() -> None:
        windows = windows_opened_since(before)
        if windows and not windows[-1].busy and windows[-1].banner.isVisible():
            seen["banner"] = windows[-1].banner.label.text()
            seen["prompt"] = windows[-1].prompt.toPlainText()
            windows[-1].close()
            loop.quit()
        else:
            QTimer.singleShot(50, check_then_quit)

    before = top_level_ids()  # the window the launch opens is none of these
    QTimer.singleShot(50, check_then_quit)
    QTimer.singleShot(15000, loop.quit)  # a safety net: never hang the suite
    code = launch(ModelSettings(path=str(tmp_path / "missing")), RunSettings(prompt="Bonjour"))
    assert code == 0
    assert "missing" in seen["banner"] and seen["prompt"] == "Bonjour"


def test_branching_during_a_run_stops_it_then_branches(qtbot, window, long_lm):
    w = window
    start_long_run(qtbot, w, long_lm, 3)
    first = w.session.runs[0].steps[1]
    alt = next(c.token_id for c in first.candidates if c.token_id != first.token_id)
    w.branch(1, alt)
    qtbot.waitUntil(lambda: len(w.session.runs) == 2 and len(w.session.runs[1].steps) >= 3, timeout=RUN_TIMEOUT_MS)
    w.stop()  # the branch keeps the parent's long budget
    qtbot.waitUntil(lambda: not w.busy, timeout=RUN_TIMEOUT_MS)
    parent, child = w.session.runs
    assert parent.finished.stop_reason == "stopped"
    assert child.generated_ids[:2] == (parent.generated_ids[0], alt)


@pytest.mark.model
def test_closing_during_a_model_load_closes_at_once(qtbot, window, default_lm):
    """A model load cannot be interrupted: the window closes now and the load ends in the background."""
    from playground.ui.main_window import running_orphans

    w = window
    w.load_model(ModelSettings(path=None, device="cpu"))
    assert w.busy
    job = w.job
    started = time.monotonic()
    with qtbot.waitSignal(w.closed, timeout=RUN_TIMEOUT_MS):
        assert w.close()
    assert time.monotonic() - started < 1.0
    assert not w.isVisible() and not w.busy
    qtbot.waitUntil(lambda: not running_orphans(), timeout=RUN_TIMEOUT_MS)
    assert job.thread.isFinished()


def test_branching_needs_the_model_that_made_the_run(qtbot, window, tiny_lm_eos):
    w = window
    generate(qtbot, w)
    step = w.session.runs[0].steps[0]
    alt = next(c.token_id for c in step.candidates if c.token_id != step.token_id)
    w.set_model(tiny_lm_eos)
    w.branch(0, alt)
    assert len(w.session.runs) == 1 and not w.busy
    assert w.banner.kind == "error" and "load that model" in w.banner.label.text()


def test_a_successful_load_clears_an_earlier_load_error(qtbot, window, tiny_lm, tmp_path):
    w = window
    w.load_model(ModelSettings(path=str(tmp_path / "no-such-model")))
    qtbot.waitUntil(lambda: not w.busy, timeout=RUN_TIMEOUT_MS)
    assert w.banner.isVisible() and w.banner.kind == "error"
    folder = tmp_path / "tiny"
    tiny_lm.model.save_pretrained(folder)
    tiny_lm.tokenizer.save_pretrained(folder)
    w.load_model(ModelSettings(path=str(folder), device="cpu", dtype="float32"))
    qtbot.waitUntil(lambda: not w.busy, timeout=RUN_TIMEOUT_MS)
    assert w.lm.path.endswith("tiny") and not w.banner.isVisible()


def test_a_quantized_run_branches_on_the_model_it_was_made_from(qtbot, window, tiny_lm):
    """A --quant run's model is named "<model> · <method>"; its start event names the model it was made from, and
    that is what a branch is checked against (not a parse of the name)."""
    window.set_run_settings(RunSettings.from_flat(prompt="Hello", chat=False, max_new_tokens=4, quant="rtn-int8"))
    generate(qtbot, window)
    run = window.session.runs[-1]
    assert run.started.model_name != tiny_lm.name and run.started.base_model == tiny_lm.name
    token = run.steps[1].candidates[1].token_id
    window.branch(1, token)
    qtbot.waitUntil(lambda: not window.busy and len(window.session.runs) == 2, timeout=RUN_TIMEOUT_MS)
    branched = window.session.runs[-1]
    assert branched.settings.forced_token_ids[-1] == token and branched.status in ("max_new_tokens", "eos")

    other = build_tiny_lm_named("tiny-other", tiny_lm)
    window.set_model(other)
    window.select_run(0)
    window.branch(1, token)
    assert window.banner.kind == "error" and "load that model" in window.banner.label.text()


def build_tiny_lm_named(name: str, like):
    """The same weights under another name: a different model as far as branching can tell."""
    import dataclasses

    return dataclasses.replace(like, name=name)
