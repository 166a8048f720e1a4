"""The KV-cache view: what the cache holds, what it costs and what it saves.

Six panels, one module each: the cache's bytes over the steps (``size``), each layer's bytes (``layers``), the paged
cache's block map (``blocks``), the latency with and without the cache (``latency``), the roofline (``roofline``) and
the batch sweep (``sweep``); this module sets them in a grid under a header and over a figures line (tokens held,
bytes per token measured vs the formula, cache, weights and process memory).

Events are folded into the Qt-free ``KVState``; the plot items are built once and updated with
``setData``/``setOpts``/``setImage``, at most every ``live_draw_ms`` while streaming (``FoldView``).
"""

from __future__ import annotations

import html
import math

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QGridLayout, QHBoxLayout, QTabWidget, QVBoxLayout, QWidget

from playground.events.kv import KVStep
from playground.state import Run
from playground.state.kv import COMPARE, PHASES, STEPS, SWEEP, KVState
from playground.ui.style import format_percent, rich_label
from playground.ui.views import register_view
from playground.ui.views.base import FoldView
from playground.ui.views.drawing import LeastHeight, fill_with_scroll
from playground.ui.views.kv.blocks import BlockPanel
from playground.ui.views.kv.latency import LatencyPanel
from playground.ui.views.kv.layers import LayerPanel
from playground.ui.views.kv.panel import format_mb
from playground.ui.views.kv.roofline import RooflinePanel
from playground.ui.views.kv.size import SizePanel
from playground.ui.views.kv.sweep import SweepPanel
from playground.ui.views.texts import status_html

THREE_COLUMNS_PX = 1100  # the panels sit in three columns from this width of the view, else in two (at 1062 px
# three columns cut the block map's title and the sweep's right axis)
PAGED_BELOW = 850  # px: two columns' three rows need about this; a lower dock pages them, two panels a page
PAGES = ("size and layers", "blocks and latency", "roofline and batch sweep")  # the tabs, in the grid's order
EXPLANATION = ("Each token's keys and values are kept for every layer, so later tokens attend to them instead of "
               "recomputing them: the cache grows by the same bytes per token (2 × layers × KV heads × head dim × "
               "bytes per element) while the weights stay fixed.")


@register_view
class KVView(FoldView):
    name = "kv"
    title = "KV cache"
    consumes = (KVStep,)
    live_draw_ms = 200  # while streaming, the plots redraw at most this often
    idle_header = ("<b>KV cache</b> — choose the kv-cache strategy and generate: what the cache holds, costs and "
                   "saves appears here.")

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.state: KVState = KVState()
        self.header = rich_label(self)
        self.explanation = rich_label(self)
        self.explanation.setText(f"<i>{EXPLANATION}</i>")
        self.figures = rich_label(self)
        self.size_panel = SizePanel(self)
        self.layer_panel = LayerPanel(self)
        self.compare_panel = LatencyPanel(self)
        self.block_panel = BlockPanel(self)
        self.roofline_panel = RooflinePanel(self)
        self.sweep_panel = SweepPanel(self)
        self.size_plot = self.size_panel.plot
        self.layer_plot = self.layer_panel.plot
        self.layer_image = self.layer_panel.image
        self.layer_colorbar = self.layer_panel.colorbar
        self.sweep_plot = self.sweep_panel.plot
        self._build_layout()
        self._start_drawing()

    # --- building -------------------------------------------------------------------------------------------
    def _build_layout(self) -> None:
        self._grid = grid = QGridLayout()
        grid.setContentsMargins(0, 0, 0, 0)
        grid.setHorizontalSpacing(8)
        self._columns = 0
        self._paged = False
        self.pages = QTabWidget(self)  # a short dock: the panels two a page (the grid holds none then)
        self._page_rows: list[QHBoxLayout] = []
        for title in PAGES:
            page = LeastHeight()  # the tab asks its pages' least heights too
            row = QHBoxLayout(page)
            row.setContentsMargins(0, 2, 0, 0)
            row.setSpacing(8)
            self._page_rows.append(row)
            self.pages.addTab(page, title)
        self.pages.hide()
        self._arrange(3)
        content = LeastHeight()
        layout = QVBoxLayout(content)
        layout.setContentsMargins(2, 2, 2, 2)
        layout.addWidget(self.header)
        layout.addWidget(self.explanation)
        layout.addLayout(grid, 1)
        layout.addWidget(self.pages, 1)
        layout.addWidget(self.figures)
        scroll = fill_with_scroll(self, content)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)  # two columns when narrow
        content.setMinimumWidth(620)

    def _arrange(self, columns: int, paged: bool = False) -> None:
        """The six panels in three columns (two rows), or in two columns (three rows) in a narrow dock, where three
        would cut their plots' titles and labels; in a dock both narrow and short (1280 x 800's), two columns of one
        row on three tabs, so that nothing scrolls."""
        paged = paged and columns == 2
        if columns == self._columns and paged == self._paged:
            return
        self._columns, self._paged = columns, paged
        for panel in self._panels():
            self._grid.removeWidget(panel)
            for row in self._page_rows:
                row.removeWidget(panel)
        for index, panel in enumerate(self._panels()):
            if paged:
                self._page_rows[index // 2].addWidget(panel, 1)
            else:
                self._grid.addWidget(panel, index // columns, index % columns)
        for column, stretch in enumerate((4, 3, 3) if columns == 3 else (1, 1, 0)):
            self._grid.setColumnStretch(column, stretch)
        self.pages.setVisible(paged)

    def _panels(self) -> tuple:
        """In the grid's order; each draws itself from the state."""
        return (self.size_panel, self.layer_panel, self.block_panel, self.compare_panel, self.roofline_panel,
                self.sweep_panel)

    def resizeEvent(self, event) -> None:
        self._arrange(3 if event.size().width() >= THREE_COLUMNS_PX else 2, event.size().height() < PAGED_BELOW)
        super().resizeEvent(event)

    def remote_note(self, run: Run) -> str:
        """A server tells only how full its cache is: llama-server's slot (tokens of its context), vLLM's usage."""
        figures = run.finished.figures if run.finished is not None else {}
        if "kv_tokens" in figures and figures.get("n_ctx"):
            tokens, n_ctx = figures["kv_tokens"], figures["n_ctx"]
            return (f"The server's KV cache after run #{run.index + 1}: {tokens:.0f} of the {n_ctx:.0f} tokens its "
                    f"slot holds ({tokens / n_ctx:.1%}), as its /slots reports.")
        if "kv_cache_usage" in figures:
            return (f"The server's KV cache after run #{run.index + 1}: {figures['kv_cache_usage']:.1%} of its "
                    "blocks in use (vLLM's kv_cache_usage_perc, across every request it serves).")
        return ""

    # --- drawing --------------------------------------------------------------------------------------------
    def _draw(self) -> None:
        # The order they were drawn in before the panels had modules of their own.
        for panel in (self.size_panel, self.layer_panel, self.compare_panel, self.block_panel, self.roofline_panel,
                      self.sweep_panel):
            panel.draw(self.state)
        self._draw_texts()

    def _draw_parts(self, parts: set[str]) -> None:
        """While streaming: the panels of the parts that changed (a step grows the size, layer and block panels;
        the latency, roofline and sweep panels wait for their own events), and the texts."""
        shows = {self.size_panel: STEPS, self.layer_panel: STEPS, self.compare_panel: COMPARE,
                 self.block_panel: STEPS, self.roofline_panel: PHASES, self.sweep_panel: SWEEP}
        for panel, part in shows.items():
            if part in parts:
                panel.draw(self.state)
        self._draw_texts()

    def _draw_texts(self) -> None:
        s = self.state
        started = s.started
        if started is None and s.last is None:
            self.figures.setText("")
            return
        status = status_html(s, "waiting for the first token…", under_way=bool(s.count))
        parts = ["<b>KV cache</b>"]
        if started is not None:
            holder = {"contiguous": "contiguous cache", "none": "no cache",
                      "paged": f"paged cache ({started.block_size}-token blocks)"}.get(started.holder,
                                                                                      started.holder)
            parts.append(holder)
            if started.holder != "none":
                parts.append(self._kv_dtype_text(started.kv_dtype))
            parts += [f"attention {html.escape(started.attn)}",
                      f"{started.layers} layers × {started.kv_heads} KV heads × head dim {started.head_dim}"]
        parts += [f"{s.count} steps", status]
        self.header.setText(" · ".join(parts))
        self.figures.setText(self._figures_html())

    def _windowed_formula_per_token(self) -> float | None:
        """The latest step's formula per token held, where it is below the every-layer-every-token figure (a model
        with sliding-window layers past its window; the step's formula counts each layer by its type)."""
        s = self.state
        started, last = s.started, s.last
        if started is None or last is None or last.tokens <= 0 or s.holder == "none":
            return None
        if last.formula_bytes >= round(started.formula_bytes_per_token * last.tokens * started.sequences):
            return None
        return last.formula_bytes / (last.tokens * s.sequences)

    def _kv_dtype_text(self, kv_dtype: str) -> str:
        if kv_dtype == "model":
            model = f" ({html.escape(self.state.model_dtype)})" if self.state.model_dtype else ""
            return f"keys and values in the model's dtype{model}"
        started = self.state.started
        if started is not None and started.kivi_group > 0:
            return (f"KIVI {html.escape(kv_dtype)}: keys per channel ({started.kivi_group}-token groups), values per "
                    f"token, the newest {started.kivi_residual} in full precision")
        return f"keys and values quantized to {html.escape(kv_dtype)} (a scale per token)"

    def _figures_html(self) -> str:
        s = self.state
        started, last = s.started, s.last
        parts = []
        if s.holder == "none":
            steps = f" for each of {s.count} steps" if s.count else ""
            parts.append(f"<b>No cache</b>: nothing held; the whole sequence was recomputed{steps}")
            last = None  # no bytes per token or cache size to speak of
        if last is not None:
            held = last.tokens * s.sequences
            parts.append(f"<b>{held:,}</b> tokens held" + (f" ({s.sequences} sequences × {last.tokens})"
                                                            if s.sequences > 1 else ""))
        measured = s.measured_bytes_per_token()
        if started is not None:
            every = (f"2 × {started.layers} layers × {started.kv_heads} KV heads × {started.head_dim} × "
                     f"{started.bytes_per_element:g} B")
            formula = f"{started.formula_bytes_per_token:,.0f} B by the formula ({every})"
            target = started.formula_bytes_per_token
            windowed = self._windowed_formula_per_token()
            if windowed is not None and last is not None:  # sliding-window layers hold their window only
                target = windowed
                formula = (f"{windowed:,.0f} B by the formula at {last.tokens:,} tokens (sliding-window layers hold "
                           f"only their window; {started.formula_bytes_per_token:,.0f} B while every layer holds "
                           f"every token: {every})")
            if measured is not None:
                agree = "✓" if math.isclose(measured, target, rel_tol=1e-9) else "≠"
                parts.append(f"bytes per token: <b>{measured:,.0f} B measured</b> {agree} {formula}")
            else:
                would = " a cache would hold" if s.holder == "none" else ""
                parts.append(f"bytes per token{would}: {formula}")
        if last is not None:
            parts.append(f"KV cache <b>{format_mb(last.total_bytes)}</b>")
        if started is not None and started.weights_bytes > 0:
            share = (f" (the cache is {format_percent(last.total_bytes / started.weights_bytes)} of them)"
                     if last is not None else "")
            parts.append(f"weights {format_mb(started.weights_bytes)}{share}")
        if last is not None and last.process_bytes > 0:
            parts.append(f"process memory {format_mb(last.process_bytes)}")
        if last is not None and last.device_reserved_bytes > 0:
            parts.append(f"device memory reserved {format_mb(last.device_reserved_bytes)}")
        return " · ".join(parts)
