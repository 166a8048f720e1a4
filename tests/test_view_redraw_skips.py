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


def test_a_view_off_screen_draws_when_shown_and_at_the_end(qtbot, tiny_lm, tmp_path):
    """The default layout tabs the views: those behind the front one fold the streamed batches in without drawing
    them; one brought to the front is drawn at once, up to date, and every view is drawn when the run ends."""
    from playground.state import Run
    from playground.ui.views.base import FoldView

    settings = RunSettings.from_flat(prompt="one two three", chat=False, strategy="sample", temperature=1.5, seed=5,
                                     max_new_tokens=12, lens=True)
    w = open_window(qtbot, tmp_path, tiny_lm, settings)
    try:
        w.generate()
        qtbot.waitUntil(lambda: not w.busy, timeout=WAIT_MS)
        events = list(w.session.selected.events)
        # The same run again, streamed into the views batch by batch, as the window's job would.
        live = Run(index=1, settings=w.session.selected.settings)
        live.apply(events[0])
        views = w.run_views
        views.show(live)  # the layers view in front (the run records the lens)
        w.docks["tokens"].raise_()  # the tokens in front: the layers (a fold view) behind it
        hidden = [n for n in views.shown if views.off_screen(n) and isinstance(views.views[n], FoldView)]
        front = [n for n in views.shown if not views.off_screen(n)]
        assert hidden and front, (views.shown, hidden, front)
        flushes: dict[str, int] = {n: 0 for n in views.shown}
        for name in views.shown:
            view = views.views[name]
            original = view.flush
            view.flush = lambda _o=original, _n=name: (flushes.__setitem__(_n, flushes[_n] + 1), _o())[1]
        body, last = events[1:-1], events[-1]
        half = len(body) // 2
        for i in range(0, half, 3):
            batch = body[i:min(i + 3, half)]
            for event in batch:
                live.apply(event)
            views.apply(live, batch)
        assert all(flushes[n] == 0 for n in hidden) and all(flushes[n] > 0 for n in front)
        target = views.views[hidden[0]]
        assert any(fold.dirty for fold in target._folds())  # folded in, not drawn

        w.docks[hidden[0]].raise_()  # to the front: drawn now, with everything it folded in
        assert flushes[hidden[0]] == 1 and not views.off_screen(hidden[0])
        qtbot.waitUntil(lambda: not any(fold.dirty for fold in target._folds()), timeout=5000)

        rest = [*body[half:], last]
        for i in range(0, len(rest), 3):
            batch = rest[i:i + 3]
            for event in batch:
                live.apply(event)
            views.apply(live, batch)
        assert live.finished is not None
        for name in views.shown:  # the end: every view drawn, off screen or not
            view = views.views[name]
            if isinstance(view, FoldView):
                assert not any(fold.dirty for fold in view._folds()), name
        assert not views.stale
    finally:
        let_go(w)
