"""The KV view's block map for a cache that keeps less: which positions sinks + window and H2O evicted, which KIVI
holds quantized and which in full precision, read back from the drawn bars of real runs on a tiny model against
the kept sets computed here (sinks, KIVI's layout) or the run's own evictions (H2O: its heads' scores)."""

from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtGui import QColor

from playground.config import RunSettings
from playground.engine.prompt import encode_prompt
from playground.engine.strategies import run_strategy
from playground.events.kv import KVStep
from playground.state import Run
from playground.ui.style import configure_pyqtgraph
from playground.ui.views.kv import TOTAL_COLOR, KVView
from playground.ui.views.kv.panel import EVICTED_COLOR, QUANTIZED_COLOR

PROMPT = "the cat sat on the mat and the dog sat on the log"
NEW = 14
KINDS = {QColor(TOTAL_COLOR).name(): "full", QColor(EVICTED_COLOR).name(): "evicted",
         QColor(QUANTIZED_COLOR).name(): "quantized"}


def shown(lm, qtbot, **options) -> tuple[KVView, list]:
    settings = RunSettings.from_flat(prompt=PROMPT, chat=False, strategy="kv-cache", max_new_tokens=NEW,
                                     compare_no_cache=False, **options)
    events = list(run_strategy(lm, settings))
    configure_pyqtgraph()
    view = KVView()
    qtbot.addWidget(view)
    view.resize(1500, 900)
    view.show()
    run = Run(index=0, settings=settings)
    for start in range(0, len(events), 5):  # live, in batches
        batch = events[start : start + 5]
        for event in batch:
            run.apply(event)
        view.apply(run, batch)
        view.flush()
    view.end(run)
    return view, events


def drawn_rows(view: KVView) -> list[list[str]]:
    """Per drawn row, top first: each position's kind, from the bars' starts, widths and colours."""
    opts = view.block_panel.spans.opts
    rows: dict[int, dict[int, str]] = {}
    for x0, y0, width, brush in zip(opts["x0"], opts["y0"], opts["width"], opts["brushes"], strict=True):
        row = rows.setdefault(int(y0), {})
        for position in range(int(x0), int(x0) + int(width)):
            assert position not in row  # runs do not overlap
            row[position] = KINDS[brush.color().name()]
    out = []
    for r in sorted(rows):
        assert sorted(rows[r]) == list(range(len(rows[r])))  # every position drawn, none skipped
        out.append([rows[r][p] for p in range(len(rows[r]))])
    return out


def fed(lm, events: list) -> int:
    """Positions in the cache at the last step: the prompt and every generated token but the last."""
    generated = len(events[-1].token_ids)
    assert generated > 8  # long enough for every rule below to drop or quantize something
    return len(encode_prompt(lm, RunSettings(prompt=PROMPT, chat=False))[0]) + generated - 1


def test_sinks_and_window_draw_what_they_dropped(tiny_lm, qtbot):
    view, events = shown(tiny_lm, qtbot, kv_keep="sinks", kv_sinks=2, kv_window=6)
    n = fed(tiny_lm, events)
    expected = ["full"] * 2 + ["evicted"] * (n - 8) + ["full"] * 6
    assert drawn_rows(view) == [expected]
    assert not view.block_panel.showing_note
    caption = view.block_panel.caption.text()
    assert f"<b>8</b> held · <b>{n - 8}</b> evicted" in caption


def test_heavy_hitters_draw_the_positions_every_head_dropped(tiny_lm, qtbot):
    view, events = shown(tiny_lm, qtbot, kv_keep="h2o", kv_window=3, kv_budget=8)
    gone = {p for e in events if isinstance(e, KVStep) for p in e.evicted}
    n = fed(tiny_lm, events)
    assert 0 < len(gone) <= n - 8  # some dropped; at least the budget held (heads may keep different ones)
    assert drawn_rows(view) == [["evicted" if p in gone else "full" for p in range(n)]]


def test_kivi_draws_its_quantized_keys_and_values(tiny_lm, qtbot):
    view, events = shown(tiny_lm, qtbot, kv_dtype="int4", kivi_group=2, kivi_residual=4)
    n = fed(tiny_lm, events)
    keys = n // 4 * 4  # whole blocks of 4 keys quantized; every value but the newest 4
    assert drawn_rows(view) == [["quantized"] * keys + ["full"] * (n - keys),
                                ["quantized"] * (n - 4) + ["full"] * 4]
    assert f"keys <b>{keys}</b> quantized" in view.block_panel.caption.text()


@pytest.mark.parametrize("options", [{}, {"paged": True, "block_size": 4}])
def test_other_caches_draw_no_positions(tiny_lm, qtbot, options):
    view, _ = shown(tiny_lm, qtbot, **options)
    assert len(np.asarray(view.block_panel.spans.opts["x0"])) == 0
    assert view.block_panel.showing_note != bool(options)  # the contiguous note, or the paged blocks
