"""The KV view's block map: the paged cache's block table, one row per sequence, one cell per block (shared blocks and
blocks reused from another run's prompt in their own colours, the last block filled as far as it is used); for a
cache that keeps less, its positions (evicted by sinks + window or H2O, quantized or in full precision under KIVI);
for any other contiguous cache, what reserving ``max_length`` up front would hold."""

from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtWidgets import QWidget

from playground.state.kv import EVICTED, QUANTIZED, KVState
from playground.ui.style import format_percent
from playground.ui.views.drawing import clear_bars, set_ticks, set_title, static_plot
from playground.ui.views.kv.panel import (
    EVICTED_COLOR,
    FREE_COLOR,
    QUANTIZED_COLOR,
    SHARED_COLOR,
    TOTAL_COLOR,
    Panel,
    format_mb,
)

REUSED_COLOR = "#228833"  # a prompt block another run wrote (prefix sharing): read, not computed, not held here
MIN_LABEL_CELL_PX = 22  # block ids are written in cells at least this wide
BLOCKS_TITLE = "Paged cache: each sequence's block table"
POSITION_COLORS = {EVICTED: EVICTED_COLOR, QUANTIZED: QUANTIZED_COLOR}  # held in full: TOTAL_COLOR


class BlockPanel(Panel):
    """The block map."""

    def __init__(self, parent: QWidget | None = None) -> None:
        plot = static_plot(parent, BLOCKS_TITLE, "position in the block table", "sequence", min_height=200)
        item = plot.getPlotItem()
        item.invertY(True)  # sequence 0 on top
        self.cells = pg.BarGraphItem(x0=[], y0=[], width=[], height=[], pen=pg.mkPen("#FFFFFF", width=1))
        self.fill = pg.BarGraphItem(x0=[], y0=[], width=[], height=[], pen=pg.mkPen("#FFFFFF", width=1))
        # A cache that keeps less: runs of positions of one kind, one bar each (x0 = first position, width = count).
        self.spans = pg.BarGraphItem(x0=[], y0=[], width=[], height=[], pen=None)
        item.addItem(self.cells)
        item.addItem(self.fill)
        item.addItem(self.spans)
        self.labels: list[pg.TextItem] = []
        self.ids: list[int] = []  # per cell, in the order of the bars
        super().__init__(plot, parent)
        item.getViewBox().sigResized.connect(self._fit_labels)

    def draw(self, s: KVState) -> None:
        started, blocks = s.started, s.blocks
        rows = s.position_map()
        if rows:
            self._set_cells([], [], [], [], [])
            self._draw_positions(s, rows)
            return
        clear_bars(self.spans)
        self._title(BLOCKS_TITLE, "position in the block table", "sequence")
        if blocks is None or started is None or started.holder != "paged":
            self._set_cells([], [], [], [], [])
            self.show_note(no_blocks_note(s))
            return
        shared, reused = set(blocks.shared), set(blocks.reused)
        fill = s.last_block_fill()
        size = max(started.block_size, 1)
        x0: list[float] = []
        y0: list[float] = []
        brushes: list[str] = []
        ids: list[int] = []
        fills: list[tuple[int, float, str]] = []
        for row, table in enumerate(blocks.tables):
            for position, block in enumerate(table):
                if block < 0:  # a sliding window's block given back: its positions are out of every later window
                    continue
                color = REUSED_COLOR if block in reused else SHARED_COLOR if block in shared else TOTAL_COLOR
                partial = position == len(table) - 1 and fill[row] < size
                if partial:  # the used part of the last block, drawn over its free slots
                    fills.append((len(x0), fill[row] / size, color))
                x0.append(float(position))
                y0.append(float(row))
                brushes.append(FREE_COLOR if partial else color)
                ids.append(block)
        self._set_cells(x0, y0, brushes, ids, fills)
        columns = max((len(t) for t in blocks.tables), default=0)
        item = self.plot.getPlotItem()
        item.setXRange(-0.05, max(columns, 1) + 0.05, padding=0)
        item.setYRange(-0.05, max(len(blocks.tables), 3) + 0.05, padding=0)  # one sequence: a row, not slabs
        set_ticks(item.getAxis("left"), [[(row + 0.5, str(row)) for row in range(len(blocks.tables))]])
        stride = max(1, math.ceil(columns / 16))
        set_ticks(item.getAxis("bottom"), [[(c + 0.5, str(c)) for c in range(0, columns, stride)]])
        free = blocks.slots_allocated - blocks.slots_used
        caption = ("Positions map to fixed-size blocks of a shared pool: a sequence wastes at most its last "
                   "block's free slots.<br>"
                   f"<span style='color:{TOTAL_COLOR}'>■</span> own block &nbsp; "
                   f"<span style='color:{SHARED_COLOR}'>■</span> shared &nbsp; "
                   + (f"<span style='color:{REUSED_COLOR}'>■</span> reused from another run &nbsp; "
                      if reused else "") +
                   f"<span style='color:{FREE_COLOR}'>■</span> free slots<br>"
                   f"{len(blocks.tables)} sequence{'s' if len(blocks.tables) != 1 else ''} · "
                   f"<b>{blocks.blocks_allocated}</b> blocks of {started.block_size} tokens allocated "
                   f"({blocks.slots_allocated} slots), {blocks.slots_used} used, <b>{free} free</b> · fragmentation "
                   f"<b>{format_percent(blocks.fragmentation)}</b> · {len(shared)} shared"
                   + (f" · <b>{len(reused)} reused</b> from another run's prompt" if reused else ""))
        self.show_plot(caption)

    def _title(self, title: str, bottom: str, left: str) -> None:
        item = self.plot.getPlotItem()
        set_title(item, title, size="10pt")
        item.setLabel("bottom", bottom)
        item.setLabel("left", left)

    def _draw_positions(self, s: KVState, rows: list[tuple[str, np.ndarray]]) -> None:
        """Each row's runs of one kind as bars: held in full, evicted, quantized."""
        started = s.started
        assert started is not None  # drawn once the run started
        kivi = started.keep == "all"
        self._title("KIVI: which keys and values are quantized" if kivi else
                    "Which positions the cache still holds", "position (prompt and output)", "")
        x0, y0, width, brushes = [], [], [], []
        for row, (_name, kinds) in enumerate(rows):
            for first, count, kind in runs(kinds):
                x0.append(float(first))
                y0.append(row + 0.1)
                width.append(float(count))
                brushes.append(pg.mkBrush(POSITION_COLORS.get(kind, TOTAL_COLOR)))
        self.spans.setOpts(x0=np.asarray(x0), y0=np.asarray(y0), width=np.asarray(width),
                           height=np.full(len(x0), 0.8), brushes=brushes)
        fed = max(len(kinds) for _name, kinds in rows)
        item = self.plot.getPlotItem()
        item.setXRange(0, max(fed, 1), padding=0.01)
        item.setYRange(-0.05, max(len(rows), 3) + 0.05, padding=0)
        set_ticks(item.getAxis("left"), [[(row + 0.5, name) for row, (name, _kinds) in enumerate(rows)]])
        set_ticks(item.getAxis("bottom"), None)
        if kivi:
            keys, values = (int((kinds == QUANTIZED).sum()) for _name, kinds in rows)
            caption = (f"KIVI {started.kv_dtype}: keys quantized per channel {started.kivi_residual} at a time "
                       f"(groups of {started.kivi_group} tokens), values per token once older than the newest "
                       f"{started.kivi_residual}.<br>"
                       f"<span style='color:{QUANTIZED_COLOR}'>■</span> quantized &nbsp; "
                       f"<span style='color:{TOTAL_COLOR}'>■</span> full precision<br>"
                       f"{fed} positions · keys <b>{keys}</b> quantized, {fed - keys} full · values <b>{values}</b> "
                       f"quantized, {fed - values} full")
        else:
            kinds = rows[0][1]
            evicted = int((kinds == EVICTED).sum())
            rule = (f"the first {started.sinks} (sinks) and the newest {started.window}" if started.keep == "sinks"
                    else f"{started.budget} per layer and head: the newest {started.window} and the most attended")
            caption = (f"{'StreamingLLM' if started.keep == 'sinks' else 'H2O'} keeps {rule}; a position is "
                       "evicted once no layer or head holds it.<br>"
                       f"<span style='color:{TOTAL_COLOR}'>■</span> held &nbsp; "
                       f"<span style='color:{EVICTED_COLOR}'>■</span> evicted<br>"
                       f"{fed} positions fed · <b>{fed - evicted}</b> held · <b>{evicted}</b> evicted")
        self.show_plot(caption)

    def _set_cells(self, x0: list[float], y0: list[float], brushes: list[str], ids: list[int],
                   fills: list[tuple[int, float, str]]) -> None:
        """One cell per block at (x0, y0); ``fills``: (cell, used share, colour) of partly used last blocks."""
        n = len(x0)
        self.cells.setOpts(x0=np.asarray(x0, dtype=float), y0=np.asarray(y0, dtype=float) + 0.08,
                           width=np.full(n, 0.94), height=np.full(n, 0.84),
                           brushes=[pg.mkBrush(b) for b in brushes])
        cells = [cell for cell, _share, _color in fills]
        self.fill.setOpts(x0=np.asarray([x0[c] for c in cells], dtype=float),
                          y0=np.asarray([y0[c] for c in cells], dtype=float) + 0.08,
                          width=np.asarray([share for _c, share, _color in fills], dtype=float) * 0.94,
                          height=np.full(len(fills), 0.84),
                          brushes=[pg.mkBrush(color) for _c, _share, color in fills])
        self.ids = list(ids)
        fill_share = {cell: share for cell, share, _color in fills}
        while len(self.labels) < n:
            label = pg.TextItem("", color="#FFFFFF", anchor=(0.5, 0.5))
            self.plot.getPlotItem().addItem(label)
            self.labels.append(label)
        for i, label in enumerate(self.labels):
            if i < n:
                label.setText(str(ids[i]))
                label.setColor("#333333" if brushes[i] == FREE_COLOR and fill_share.get(i, 0.0) <= 0.5
                               else "#FFFFFF")
                label.setPos(x0[i] + 0.47, y0[i] + 0.5)
        self._fit_labels()

    def _fit_labels(self) -> None:
        """Block ids in their cells when the cells are wide enough to hold them."""
        n = len(self.ids)
        box = self.plot.getPlotItem().getViewBox()
        (low, high), _ = box.viewRange()
        wide = n > 0 and box.width() / max(high - low, 1.0) >= MIN_LABEL_CELL_PX
        for i, label in enumerate(self.labels):
            label.setVisible(wide and i < n)


def no_blocks_note(s: KVState) -> str:
    started = s.started
    if started is None:
        return "<b>Block map</b><br>The paged cache's blocks appear here during a kv-cache run."
    if started.holder == "none":
        return ("<b>No cache in this run</b><br>Every step recomputed the keys and values of the whole "
                "sequence: nothing was kept, so there are no blocks to show.")
    if started.holder == "paged":
        return "<b>Paged cache</b><br>The block tables appear with the first step."
    reserved = s.contiguous_reserved_bytes()
    held = s.last.total_bytes if s.last is not None else 0
    reserve = (f"A contiguous cache reserved up front for max_length = {started.max_length} tokens (prompt + "
               f"max new tokens) would hold <b>{format_mb(reserved)}</b>"
               + (f", of which this run used {format_mb(held)} ({format_percent(held / reserved)})"
                  if reserved and s.last is not None else "") + "." if reserved else "")
    return ("<b>Contiguous cache: no blocks</b><br>This run kept one growing tensor per layer, not fixed-size "
            f"blocks (switch on “paged cache” to see a block table).<br>{reserve}")


def runs(kinds: np.ndarray) -> list[tuple[int, int, int]]:
    """(first position, count, kind) of each run of equal kinds, in order."""
    if kinds.size == 0:
        return []
    edges = np.flatnonzero(np.diff(kinds)) + 1
    starts = np.concatenate(([0], edges))
    ends = np.concatenate((edges, [kinds.size]))
    return [(int(a), int(b - a), int(kinds[a])) for a, b in zip(starts, ends, strict=True)]
