"""The track view: type a word, a token or a token id; two plots follow it through the run.

- Probability (log scale): raw model probability (blue) and after the sampler pipeline (orange), exact where the
  step recorded the token among its candidates; where it did not, a grey ▼ at the most it can be (the lowest
  recorded candidate's raw probability: "below rank N"), and no processed value. A processed 0 (a sampler cut it)
  sits on the floor as ×.
- Raw rank (log scale, 1 at the top): exact ranks, and ▼ "below rank N" where not recorded.

A word is read with the loaded model's tokenizer (its first token is tracked, and the note says so); without one,
the text is looked for among the candidates the run recorded (spaces count: " Paris" is not "Paris").
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QHBoxLayout, QLabel, QLineEdit, QVBoxLayout, QWidget

from playground.events import Event, TokenStep
from playground.state import Run, visible_token_text
from playground.state.track import TrackedPoint, find_token_by_text, track_token
from playground.ui.style import CUT_COLOR, PROCESSED_COLOR, RAW_COLOR
from playground.ui.views import register_view
from playground.ui.views.base import View

PROB_FLOOR = 1e-7  # a processed 0 (cut) is drawn here, on the log axis


def _floored(values: list[float]) -> np.ndarray:
    return np.array([max(v, PROB_FLOOR) for v in values], dtype=float)


def _line(item: pg.PlotDataItem, steps: list[int], values: list[float]) -> None:
    """Points at ``steps``, joined only where the steps follow one another (a gap where nothing is known)."""
    x = np.array(steps, dtype=float)
    connect = np.append(np.diff(x) == 1, False) if len(x) else np.array([], dtype=bool)
    item.setData(x, _floored(values), connect=connect)


@register_view
class TrackView(View):
    name = "track"
    title = "Track a token"
    consumes = (TokenStep,)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.run: Run | None = None
        self.tokenizer: Any = None
        self.token_id: int | None = None
        self.points: list[TrackedPoint] = []
        self._drawn: tuple[tuple[TrackedPoint, ...], str] | None = None  # (points, note) last drawn
        self.entry = QLineEdit()
        self.entry.setPlaceholderText("a word, a token or a token id (spaces count: ' Paris' ≠ 'Paris')")
        self.entry.setToolTip("The token to follow through the run; Enter to track it")
        self.entry.editingFinished.connect(self._entry_done)
        self.note = QLabel("Type a token to follow its probability and rank at every step of the shown run.")
        self.note.setWordWrap(True)
        self.note.setTextFormat(Qt.TextFormat.PlainText)

        self.prob_plot = pg.PlotWidget()
        self.prob_plot.setLogMode(False, True)
        self.prob_plot.setLabel("left", "probability")
        self.prob_plot.getAxis("left").enableAutoSIPrefix(False)
        self.prob_plot.setLabel("bottom", "step")
        self.prob_plot.showGrid(x=True, y=True, alpha=0.3)
        self.prob_plot.addLegend(offset=(-4, 4))
        self.raw_curve = self.prob_plot.plot([], [], pen=pg.mkPen(RAW_COLOR, width=2), symbol="o", symbolSize=6,
                                             symbolBrush=RAW_COLOR, symbolPen=None, name="raw model")
        self.processed_curve = self.prob_plot.plot([], [], pen=pg.mkPen(PROCESSED_COLOR, width=2), symbol="s",
                                                   symbolSize=6, symbolBrush=PROCESSED_COLOR, symbolPen=None,
                                                   name="after processors")
        # Marks without lines (plot items, not scatter items: those follow the log axis too).
        self.raw_bound = self.prob_plot.plot([], [], pen=None, symbol="t", symbolSize=9, symbolPen=None,
                                             symbolBrush=CUT_COLOR, name="below rank N: at most")
        self.cut_marks = self.prob_plot.plot([], [], pen=None, symbol="x", symbolSize=9, symbolPen=None,
                                             symbolBrush=PROCESSED_COLOR, name="cut (processed 0)")

        self.rank_plot = pg.PlotWidget()
        self.rank_plot.setLogMode(False, True)
        self.rank_plot.setLabel("left", "raw rank")
        self.rank_plot.setLabel("bottom", "step")
        self.rank_plot.invertY(True)
        self.rank_plot.showGrid(x=True, y=True, alpha=0.3)
        self.rank_curve = self.rank_plot.plot([], [], pen=pg.mkPen("#444444", width=2), symbol="o", symbolSize=6,
                                              symbolBrush="#444444", symbolPen=None)
        self.rank_bound = self.rank_plot.plot([], [], pen=None, symbol="t", symbolSize=9, symbolPen=None,
                                              symbolBrush=CUT_COLOR)
        self.rank_plot.setXLink(self.prob_plot)

        top = QHBoxLayout()
        top.addWidget(QLabel("Track"))
        top.addWidget(self.entry, 1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addLayout(top)
        layout.addWidget(self.note)
        layout.addWidget(self.prob_plot, 3)
        layout.addWidget(self.rank_plot, 2)

    # --- the view interface ---------------------------------------------------------------------------------
    def reset(self) -> None:
        self.run = None
        self.points = []
        self._draw()

    def apply(self, run: Run, events: list[Event]) -> None:
        self.run = run

    def flush(self) -> None:
        self._track()

    def end(self, run: Run) -> None:
        self.run = run
        self._track()

    def set_tokenizer(self, tokenizer: Any) -> None:
        """The loaded model's tokenizer, to read a typed word (None: look among the recorded candidates)."""
        self.tokenizer = tokenizer

    # --- tracking -------------------------------------------------------------------------------------------
    def track(self, text: str) -> None:
        """Follow ``text`` (a token id, a word or a token's text) through the shown run."""
        self.entry.setText(text)
        self._entry_done()

    def _entry_done(self) -> None:
        text = self.entry.text()
        self.token_id, why = self._resolve(text)
        self._why = why
        self._track()

    def _resolve(self, text: str) -> tuple[int | None, str]:
        if not text:
            return None, "Type a token to follow its probability and rank at every step of the shown run."
        if text.strip().isdigit():
            return int(text.strip()), f"token id {int(text.strip())}"
        steps = self.run.steps if self.run is not None else []
        if self.tokenizer is not None:
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            if not ids:
                return None, f"'{visible_token_text(text)}' is no token at all"
            more = f" ('{visible_token_text(text)}' is {len(ids)} tokens: the first is tracked)" if len(ids) > 1 else ""
            return ids[0], f"token {ids[0]} '{visible_token_text(self.tokenizer.decode(ids[:1]))}'{more}"
        found = find_token_by_text(steps, text)
        if found is None:
            return None, (f"'{visible_token_text(text)}' is not among the run's recorded candidates (load the model "
                          "to track any word; spaces count)")
        return found, f"token {found} '{visible_token_text(text)}' (found among the recorded candidates)"

    def _track(self) -> None:
        steps = self.run.steps if self.run is not None else []
        self.points = track_token(steps, self.token_id) if self.token_id is not None and steps else []
        self._draw()

    def _note_text(self) -> str:
        pts = self.points
        if self.token_id is None or not pts:
            return getattr(self, "_why", "") or ("Type a token to follow its probability and rank at every step of "
                                                 "the shown run.")
        exact = sum(p.exact for p in pts)
        ns = sorted({p.below_rank for p in pts if not p.exact})
        below_text = (f"; ▼ at {len(pts) - exact} steps: below rank {', '.join(map(str, ns))} (not recorded: at most "
                      "that candidate's probability)" if ns else "")
        return (f"Tracking {self._why}: exact at {exact} of {len(pts)} steps (among the recorded "
                f"candidates){below_text}.")

    def _draw(self) -> None:
        """The plots and the note, where they changed: a batch that moves no tracked point (no token tracked, or
        steps that do not hold it) draws nothing, as every ``setData`` repaints both plots, their log axes and the
        legend."""
        pts = self.points
        note = self._note_text()
        drawn = (tuple(pts), note)
        if drawn == self._drawn:
            return
        self._drawn = drawn
        exact = [p for p in pts if p.exact]
        _line(self.raw_curve, [p.step for p in exact], [p.raw_prob or 0.0 for p in exact])
        kept = [p for p in exact if p.processed_prob]
        _line(self.processed_curve, [p.step for p in kept], [p.processed_prob or 0.0 for p in kept])
        cut = [p for p in pts if p.exact and p.processed_prob == 0.0]
        self.cut_marks.setData([p.step for p in cut], [PROB_FLOOR] * len(cut))
        below = [p for p in pts if not p.exact]
        self.raw_bound.setData([p.step for p in below], [max(p.raw_bound, PROB_FLOOR) for p in below])
        _line(self.rank_curve, [p.step for p in exact], [float(p.rank or 1) for p in exact])
        self.rank_bound.setData([p.step for p in below], [float(max(p.below_rank, 1) + 1) for p in below])
        self.note.setText(note)
