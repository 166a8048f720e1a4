"""Streaming draws that change nothing are skipped, and what is shown stays what a full draw shows.

- The track view with no token tracked draws nothing while a run streams (each of its ``setData`` calls repainted
  both plots, their log axes and the legend); a token tracked afterwards, and one cleared, are drawn at once.
- ``set_ticks`` / ``set_title`` (views/drawing.py) leave an axis's picture and a plot's title alone when they are
  given what they already show, and set them when it differs.
"""

from __future__ import annotations

import pyqtgraph as pg
import torch
from windows import let_go, open_window

from playground.config import RunSettings
from playground.ui.views.drawing import set_ticks, set_title

WAIT_MS = 30000


def test_the_track_view_draws_nothing_while_no_token_is_tracked(qtbot, tiny_lm, tmp_path, monkeypatch):
    settings = RunSettings(prompt="one two three", chat=False, strategy="sample", temperature=1.5, seed=5,
                           max_new_tokens=12, num_candidates=5, record_candidates=0)
    w = open_window(qtbot, tmp_path, tiny_lm, settings)
    try:
        view = w.views["track"]
        view.reset()  # drawn once, empty: what every later draw of an untracked run would draw again
        calls: list[str] = []
        for name in ("raw_curve", "processed_curve", "raw_bound", "cut_marks", "rank_curve", "rank_bound"):
            curve = getattr(view, name)
            original = curve.setData
            monkeypatch.setattr(curve, "setData",
                                lambda *a, _o=original, _n=name, **k: (calls.append(_n), _o(*a, **k))[1])
        w.generate()
        qtbot.waitUntil(lambda: not w.busy, timeout=WAIT_MS)
        run = w.session.selected
        assert len(run.steps) == 12
        assert calls == []  # nothing tracked: the run streamed without one draw of the plots

        # A token tracked now is drawn at once: the run's own first token, exact at every step that recorded it.
        token = run.steps[0].token_id
        recorded = [s.step for s in run.steps if any(c.token_id == token for c in s.candidates)]
        view.track(str(token))
        x, y = view.raw_curve.getData()
        assert list(x) == recorded and calls
        probs = [next(c.raw_prob for c in s.candidates if c.token_id == token) for s in run.steps
                 if s.step in recorded]
        assert torch.allclose(torch.tensor(10 ** y), torch.tensor(probs, dtype=torch.float64), rtol=1e-6)

        # Cleared: the plots empty again and the note says so (the skip does not keep the last drawing).
        view.track("")
        x, _ = view.raw_curve.getData()
        assert x is None or len(x) == 0
        assert view.note.text().startswith("Type a token")
    finally:
        let_go(w)


def test_set_ticks_and_set_title_skip_only_what_is_shown_already(qtbot):
    plot = pg.PlotWidget()
    qtbot.addWidget(plot)
    item = plot.getPlotItem()
    axis = item.getAxis("bottom")
    set_ticks(axis, [[(0.0, "a"), (1.0, "b")]])
    assert axis._tickLevels == [[(0.0, "a"), (1.0, "b")]]
    axis.picture = picture = object()  # what the axis drew: kept when the same ticks come again
    set_ticks(axis, [[(0.0, "a"), (1.0, "b")]])
    assert axis.picture is picture
    set_ticks(axis, [[(0.0, "a"), (1.0, "c")]])
    assert axis.picture is None and axis._tickLevels == [[(0.0, "a"), (1.0, "c")]]
    set_ticks(axis, None)
    assert axis._tickLevels is None

    set_title(item, "Step 1", size="10pt")
    html = item.titleLabel.item.toHtml()
    item.titleLabel.item.setHtml("kept")  # marks the label: a skipped title leaves it as it is
    set_title(item, "Step 1", size="10pt")
    assert item.titleLabel.item.toPlainText() == "kept"
    set_title(item, "Step 1", size="12pt")  # another size is another title
    assert item.titleLabel.item.toPlainText() == "Step 1" and item.titleLabel.opts["size"] == "12pt"
    set_title(item, "Step 2", size="10pt")
    assert item.titleLabel.text == "Step 2" and item.titleLabel.item.toHtml() != html
    set_title(item, None)
    assert not item.titleLabel.isVisible()
    set_title(item, "Step 2", size="10pt")  # shown again, though its text is the one it had
    assert item.titleLabel.isVisible()

