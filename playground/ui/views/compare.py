"""The side-by-side view: 2-4 configurations on the same prompt in aligned panes, with the figures of each output.

Figures (``PaneFinished.figures``): log-likelihood under the loaded model (how likely the model finds the text, in
nats; per token), distinct-1/-2 (unique uni-/bigrams over all: lower = more repetitive), repeated 3-grams, the first
divergence from the reference pane, length, time; for ``kv-cache`` panes (the kv-long-context preset), the KV
bytes held at the end and at the peak and, for a cache that keeps less, its teacher-forced mean KL and top-1
agreement against the full cache and where its greedy output first leaves the full cache's.
Exports the picture (PNG/SVG) or the comparison as JSON.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

from PySide6.QtWidgets import QHeaderView, QTableWidget, QTableWidgetItem, QVBoxLayout

from playground.events import Event
from playground.events.panes import PaneToken
from playground.state import Run
from playground.state.panes import PanesState
from playground.ui.style import rich_label
from playground.ui.views import register_view
from playground.ui.views.base import FoldView
from playground.ui.views.kv.panel import format_mb
from playground.ui.views.side_by_side import SideBySidePanes

HEADER_PADDING = 12  # px a header section keeps around its text


def wrap_words(text: str, width: float, advance) -> str:
    """``text`` broken at spaces into lines at most ``width`` wide (``advance``: a string's width); a word wider
    than that keeps a line of its own."""
    lines: list[str] = []
    for word in text.split():
        if lines and advance(f"{lines[-1]} {word}") <= width:
            lines[-1] = f"{lines[-1]} {word}"
        else:
            lines.append(word)
    return "\n".join(lines)


# Table rows: (figure key, label, format).
FIGURE_ROWS = (
    ("tokens", "tokens", "{:.0f}"),
    ("log_likelihood", "log-likelihood (nats)", "{:.1f}"),
    ("mean_logprob", "per token (nats)", "{:.3f}"),
    ("distinct_1", "distinct-1", "{:.3f}"),
    ("distinct_2", "distinct-2", "{:.3f}"),
    ("repeated_3grams", "repeated 3-grams", "{:.0f}"),
    ("first_divergence", "first divergence (token)", "{:.0f}"),
)
# A kv-cache pane's cache (rows shown when a pane has them): bytes held, and a cache that keeps less against the
# full cache on its own tokens (teacher-forced KL and top-1 agreement, where its greedy output first leaves it).
KV_ROWS = (
    ("kv_bytes", "KV held at the end", format_mb),
    ("kv_peak_bytes", "KV peak", format_mb),
    ("kv_mean_kl", "KV mean KL vs full (nats)", "{:.4f}"),
    ("kv_top1_agreement", "KV top-1 agreement", "{:.1%}"),
    ("kv_first_divergence", "KV greedy divergence (token)", "{:.0f}"),
)
BYTE_KEYS = ("kv_bytes", "kv_peak_bytes")


def figure_cell(key: str, fmt, value: float | None, column: int) -> str:
    """A figure as its table cell ("" when the pane has none)."""
    if value is None:
        return ""
    if key == "first_divergence":
        return "reference" if column == 0 else "never" if value < 0 else f"{value + 1:.0f}"
    if key == "kv_first_divergence":
        return "never" if value < 0 else f"{value + 1:.0f}"
    return fmt(value) if callable(fmt) else fmt.format(value)


@register_view
class CompareView(FoldView):
    name = "compare"
    title = "Side by side"
    consumes = (PaneToken,)
    data_formats = ("json",)
    live_draw_ms = 150

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.state: PanesState = PanesState()
        self.run: Run | None = None
        self.header = rich_label(self)
        self.panes = SideBySidePanes(self.state, None, self)  # the figures are in the table below
        self.table = QTableWidget(self)
        self.table.verticalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        self.table.horizontalHeader().sectionResized.connect(lambda *_: self._wrap_header())
        self.table.setMinimumHeight(235)
        self.table.setMaximumHeight(260)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(2, 2, 2, 2)
        layout.addWidget(self.header)
        layout.addWidget(self.panes, stretch=2)
        layout.addWidget(self.table, stretch=1)
        self._start_drawing()

    def empty_text(self, run: Run | None) -> str:
        return ("Side by side: choose the compare strategy (2-4 panes, each a strategy and its options) and "
                "generate; or run a quantization method with compare on.")

    # --- the view interface -----------------------------------------------------------------------------------
    def _forget(self) -> None:
        self.run = None

    def apply(self, run: Run, events: list[Event]) -> None:
        super().apply(run, events)
        self.run = run  # after a RunStarted's reset

    # --- drawing ----------------------------------------------------------------------------------------------
    def _draw(self) -> None:
        if not self.state.panes:
            self.header.setText("<b>Side by side</b> — the same prompt through 2-4 configurations appears here.")
        else:
            prompt = self.run.settings.prompt if self.run is not None else ""
            short = prompt if len(prompt) < 160 else "…" + prompt[-160:]
            self.header.setText(f"<b>Side by side</b> — {len(self.state.panes)} configurations, same prompt: "
                                f"<span style='color:#555'>{html.escape(short)}</span>")
        self.panes.refresh()
        self._draw_table()

    def figure_rows(self) -> tuple[tuple[str, str, object], ...]:
        """The table's figure rows: every output's, and first the cache's when a pane is a kv-cache run (what
        such a comparison is about: in a short dock the rows below them scroll)."""
        finished = [p.finished for p in self.state.panes if p.finished is not None]
        kv = tuple(row for row in KV_ROWS if any(row[0] in done.figures for done in finished))
        return kv + FIGURE_ROWS

    def _draw_table(self) -> None:
        panes = self.state.panes
        rows = self.figure_rows()
        self.table.setColumnCount(len(panes))
        self.table.setRowCount(len(rows) + 2)
        self.table.setMaximumHeight(260 + 24 * (len(rows) - len(FIGURE_ROWS)))
        self.table.setHorizontalHeaderLabels([p.label for p in panes])
        self._wrap_header()
        self.table.setVerticalHeaderLabels(["stop", "tokens/s", *(label for _, label, _ in rows)])
        for column, pane in enumerate(panes):
            done = pane.finished
            cells = [("running" if done is None else done.stop_reason, ""),
                     ("" if done is None else f"{done.tokens_per_s:.1f}", "")]
            for key, _, fmt in rows:
                value = None if done is None else done.figures.get(key)
                exact = f"{value:,.0f} bytes" if key in BYTE_KEYS and value is not None else ""
                cells.append((figure_cell(key, fmt, value, column), exact))
            for row, (text, tip) in enumerate(cells):
                item = QTableWidgetItem(text)
                item.setToolTip(tip)
                self.table.setItem(row, column, item)

    def _wrap_header(self) -> None:
        """Each column's title on as many lines as its width needs (a long pane label was cut at both ends)."""
        header = self.table.horizontalHeader()
        metrics = header.fontMetrics()
        for column, pane in enumerate(self.state.panes[: self.table.columnCount()]):
            item = self.table.horizontalHeaderItem(column)
            if item is None:
                continue
            text = wrap_words(pane.label, header.sectionSize(column) - HEADER_PADDING, metrics.horizontalAdvance)
            if item.text() != text:
                item.setText(text)

    # --- data -------------------------------------------------------------------------------------------------
    def comparison(self) -> dict:
        """The comparison as plain values: the prompt and, per pane, its label, text, tokens and figures."""
        run = self.run
        return {
            "prompt": run.started.prompt_text if run is not None and run.started else "",
            "settings": run.started.settings if run is not None and run.started else {},
            "panes": [{"label": p.label, "strategy": p.strategy, "text": p.text, "token_ids": list(p.token_ids),
                       "stop_reason": p.finished.stop_reason if p.finished else None,
                       "tokens_per_s": p.finished.tokens_per_s if p.finished else None,
                       "figures": dict(p.finished.figures) if p.finished else {}}
                      for p in self.state.panes],
        }

    def export_data(self, path: Path) -> None:
        path.write_text(json.dumps(self.comparison(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
