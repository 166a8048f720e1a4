"""The patching view: one heat map per patched activation (residual stream, attention output, MLP output),
blocks up the side, the prompt's tokens along the bottom, each cell the share of the logit difference that
patching the clean activation there into the corrupted run brings back (1 = all of it, 0 = none), on a diverging
scale clamped to −1..1 with its colour bar. Rows fill in as the run computes them."""

from __future__ import annotations

import html
from pathlib import Path

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF
from PySide6.QtWidgets import QHBoxLayout, QLabel, QVBoxLayout, QWidget

from playground.events import Event
from playground.events.patching import MAP_TITLES, PATCH_MAPS, PatchingRow, PatchingStarted
from playground.state import Run, visible_token_text
from playground.ui.style import rich_label
from playground.ui.views import register_view
from playground.ui.views.base import View
from playground.ui.views.drawing import ThrottledDraw, set_ticks, static_plot
from playground.ui.views.steering.heatmap import diverging_colormap
from playground.ui.views.texts import short_label


class PatchMap:
    """One map's plot, image and colour bar: built once, updated by ``draw``."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.plot = static_plot(None, f"Patched: {MAP_TITLES[kind]}", "position", "block")
        item = self.plot.getPlotItem()
        item.getAxis("left").enableAutoSIPrefix(False)
        self.image = pg.ImageItem(axisOrder="row-major")
        item.addItem(self.image)
        self.colorbar = pg.ColorBarItem(values=(-1.0, 1.0), colorMap=diverging_colormap(), label="recovered share",
                                        interactive=False, width=14)
        self.colorbar.setImageItem(self.image, insert_in=item)
        self.plot.setMinimumHeight(220)

    def show_colorbar(self, shown: bool) -> None:
        self.colorbar.setVisible(shown)
        self.plot.setMinimumWidth(300 if shown else 0)  # room for the bar beside the map

    def draw(self, values: np.ndarray, ticks: list[tuple[float, str]]) -> None:
        rows, n = values.shape
        item = self.plot.getPlotItem()
        shown = np.nan_to_num(np.clip(values, -1.0, 1.0), nan=0.0)
        self.image.setImage(shown, autoLevels=False, levels=(-1.0, 1.0))
        self.image.setRect(QRectF(-0.5, -0.5, n, rows))
        item.setXRange(-0.5, n - 0.5, padding=0)
        item.setYRange(-0.5, rows - 0.5, padding=0)
        step = 1 if rows <= 12 else max(1, rows // 8)
        set_ticks(item.getAxis("left"), [[(float(i), str(i)) for i in range(rows) if i % step == 0]])
        set_ticks(item.getAxis("bottom"), [ticks])


@register_view
class PatchingView(View):
    name = "patching"
    title = "Activation patching"
    consumes = (PatchingRow,)
    data_formats = ("csv",)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.header = rich_label()
        self.maps = {kind: PatchMap(kind) for kind in PATCH_MAPS}
        self.note = rich_label()
        layout = QVBoxLayout(self)
        layout.addWidget(self.header)
        row = QHBoxLayout()
        for patch_map in self.maps.values():
            row.addWidget(patch_map.plot)
        layout.addLayout(row, 1)
        layout.addWidget(self.note)
        self.empty = QLabel("")
        layout.addWidget(self.empty)
        self._draw = ThrottledDraw(self, 100, self._redraw)
        self._streaming = False
        self.reset()

    def reset(self) -> None:
        self.started: PatchingStarted | None = None
        self.values: dict[str, np.ndarray] = {}
        self.times: dict[str, float] = {}
        self.ended = ""
        self.empty.setText(self.empty_text(None))
        self.empty.setVisible(True)
        for patch_map in self.maps.values():
            patch_map.plot.setVisible(False)
        self.header.setText("")
        self.note.setText("")

    def apply(self, run: Run, events: list[Event]) -> None:
        for event in events:
            if isinstance(event, PatchingStarted):
                self.started = event
                self.values = {kind: np.full((event.layers, len(event.clean_ids)), np.nan) for kind in event.maps}
            elif isinstance(event, PatchingRow) and event.map in self.values:
                self.values[event.map][event.layer] = event.recovered
                self.times[event.map] = self.times.get(event.map, 0.0) + event.seconds
        self._streaming = run.running

    def flush(self) -> None:
        self._draw.request(self._streaming)

    def end(self, run: Run) -> None:
        self.ended = run.status
        self._draw.cancel()
        self._redraw()

    def _redraw(self) -> None:
        s = self.started
        self.empty.setVisible(s is None)
        if s is None:
            return
        ticks = [(float(i), short_label(visible_token_text(a) if a == b else
                                        f"{visible_token_text(a)}/{visible_token_text(b)}", 14))
                 for i, (a, b) in enumerate(zip(s.clean_tokens, s.corrupted_tokens, strict=True))]
        last = [kind for kind in self.maps if kind in self.values][-1:]
        for kind, patch_map in self.maps.items():
            patch_map.plot.setVisible(kind in self.values)
            patch_map.show_colorbar(kind in last)  # one scale (−1..1) for every map: one colour bar
            if kind in self.values:
                patch_map.draw(self.values[kind], ticks)
        clean = html.escape("".join(s.clean_tokens))
        corrupted = html.escape("".join(s.corrupted_tokens))
        self.header.setText(
            f"Clean <b>{clean}</b> → corrupted <b>{corrupted}</b> (positions "
            f"{', '.join(str(p) for p in s.differ)} differ; ticks read clean/corrupted there). "
            f"Metric: logit({html.escape(repr(s.answer_text))}) − "
            f"logit({html.escape(repr(s.foil_text))}) at the last position: clean {s.clean_diff:.2f}, corrupted "
            f"{s.corrupted_diff:.2f}. A cell: (patched − corrupted) / (clean − corrupted), the clean activation "
            "at that block and position written into the corrupted run.")
        parts = []
        for kind, values in self.values.items():
            done = int(np.isfinite(values).all(axis=1).sum())
            when = f", {self.times[kind]:.1f} s" if kind in self.times else ""  # the rows' compute time
            best = np.nanmax(values) if np.isfinite(values).any() else float("nan")
            parts.append(f"{MAP_TITLES[kind]}: {done}/{values.shape[0]} blocks{when}, most recovered {best:.2f}")
        status = f" — run {self.ended}" if self.ended and self.ended != "max_new_tokens" else ""
        self.note.setText("; ".join(parts) + status + ". Residual: the stream entering each block (block 0: the "
                          "embeddings); attention and MLP: each block's output before the residual add.")

    def export_data(self, path: Path) -> None:
        if self.started is None:
            raise ValueError("no patching run is shown")
        lines = ["map,block,position,clean_token,corrupted_token,recovered"]
        for kind, values in self.values.items():
            for layer, row in enumerate(values):
                for p, v in enumerate(row):
                    lines.append(f"{kind},{layer},{p},{self.started.clean_tokens[p]!r},"
                                 f"{self.started.corrupted_tokens[p]!r},{v:.6g}")
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
