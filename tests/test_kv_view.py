"""The KV-cache view and its Qt-free state: hand-made events with SmolLM2's numbers (30 layers, 3 KV heads, head
dim 64, fp32: 46,080 bytes per token; 538 MB of weights), and real kv-cache runs of a tiny model once the strategy
is registered.

Every number the view plots is checked against the events themselves, counted here independently.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from PySide6.QtGui import QColor
from windows import open_window

from playground.config import ConfigError, RunSettings
from playground.engine.strategies import run_strategy
from playground.events import PrefillDone, RunFinished, RunStarted, TokenStep
from playground.events.kv import KVBlocks, KVCompare, KVPhase, KVStarted, KVStep, KVSweep
from playground.state import Run
from playground.state.kv import FIRST_CAPACITY, KVState
from playground.traces import read_trace, write_trace
from playground.ui.style import configure_pyqtgraph, format_percent
from playground.ui.views import view_names
from playground.ui.views.kv import FREE_COLOR, MB, SHARED_COLOR, TOTAL_COLOR, KVView, format_mb

LAYERS, KV_HEADS, HEAD_DIM, ELEMENT = 30, 3, 64, 4
PER_TOKEN = 2 * LAYERS * KV_HEADS * HEAD_DIM * ELEMENT  # 46,080
WEIGHTS = 538_060_032  # 134,515,008 fp32 parameters
PROMPT_TOKENS = 39
BLOCK = 16
PEAK_FLOPS, PEAK_BW = 95e9, 23e9
PROMPT = "the cat sat on the mat"


# --- hand-made events ---------------------------------------------------------------------------------------
def paged_blocks(tokens: int, sequences: int) -> KVBlocks:
    """Sequences that share the prompt's full blocks, then each its own: ids 0.. for the shared prefix."""
    shared = PROMPT_TOKENS // BLOCK
    own = math.ceil(tokens / BLOCK) - shared
    tables = tuple(tuple(range(shared)) + tuple(shared + s * own + j for j in range(own)) for s in range(sequences))
    shared_ids = tuple(range(shared)) if sequences > 1 else ()
    allocated = shared + own * sequences
    used = shared * BLOCK + (tokens - shared * BLOCK) * sequences
    return KVBlocks(tables=tables, shared=shared_ids, blocks_allocated=allocated, slots_allocated=allocated * BLOCK,
                    slots_used=used, fragmentation=1 - used / (allocated * BLOCK))


def kv_run(new_tokens: int = 60, holder: str = "contiguous", sequences: int = 1, compare: bool = True,
           sweep: bool = True, device_reserved: bool = False, window: int = 0) -> list:
    """A SmolLM2-like kv-cache run: prompt of 39 tokens, ``new_tokens`` steps. ``window``: every second layer
    keeps only the last ``window`` positions (as sliding-window layers do), so layers differ."""
    max_length = PROMPT_TOKENS + new_tokens
    events: list = [
        RunStarted(strategy="kv-cache", prompt_text="p", prompt_token_ids=tuple(range(PROMPT_TOKENS)),
                   forced_token_ids=(), model_name="SmolLM2", model_path="m", device="cpu", dtype="float32",
                   settings={"strategy": "kv-cache", "max_new_tokens": new_tokens,
                             "kv": {"paged": holder == "paged", "no_cache": holder == "none"}}),
        KVStarted(holder=holder, block_size=BLOCK if holder == "paged" else 0, kv_dtype="model", attn="sdpa",
                  layers=LAYERS, kv_heads=KV_HEADS, head_dim=HEAD_DIM, bytes_per_element=ELEMENT,
                  formula_bytes_per_token=PER_TOKEN, weights_bytes=WEIGHTS, max_length=max_length,
                  peak_flops=PEAK_FLOPS, peak_bytes_per_s=PEAK_BW),
        PrefillDone(prompt_tokens=PROMPT_TOKENS, prefill_ms=150.0, kv_cache_bytes=PROMPT_TOKENS * PER_TOKEN),
    ]
    for step in range(new_tokens):
        tokens = PROMPT_TOKENS + step if holder != "none" else 0  # no cache holds no position
        blocks = paged_blocks(tokens, sequences) if holder == "paged" else None
        if holder == "none":
            held = 0
        elif blocks is not None:
            held = blocks.slots_allocated * PER_TOKEN  # a paged pool holds whole blocks
        else:
            held = tokens * PER_TOKEN * sequences
        layer_bytes = tuple([held // LAYERS] * LAYERS)
        if window:
            layer_bytes = tuple(b if i % 2 == 0 else min(tokens, window) * (PER_TOKEN // LAYERS)
                                for i, b in enumerate(layer_bytes))
        events.append(KVStep(step=step, tokens=tokens, layer_bytes=layer_bytes, total_bytes=sum(layer_bytes),
                             formula_bytes=0 if holder == "none" else PER_TOKEN * tokens * sequences,
                             process_bytes=1_210_000_000 + 40_000 * step,
                             device_reserved_bytes=2_000_000_000 if device_reserved else 0, blocks=blocks))
        events.append(TokenStep(step=step, token_id=step, text=f" w{step}", prob=0.5, raw_prob=0.5,
                                logprob=math.log(0.5), raw_rank=1, entropy=1.0, processed_entropy=1.0, candidates=(),
                                shown_raw_mass=0.5, effects=(), forced=False, step_ms=43.0,
                                kv_cache_bytes=sum(layer_bytes)))
    prefill_flops, decode_flops = 2 * 134.5e6 * PROMPT_TOKENS, 2 * 134.5e6 * new_tokens
    prefill_bytes, decode_bytes = WEIGHTS + PROMPT_TOKENS * PER_TOKEN, new_tokens * WEIGHTS * 1.01
    events += [
        KVPhase(phase="prefill", tokens=PROMPT_TOKENS, ms=150.0, flops=prefill_flops, bytes_moved=prefill_bytes,
                intensity=prefill_flops / prefill_bytes, achieved_flops=prefill_flops / 0.150),
        KVPhase(phase="decode", tokens=new_tokens, ms=43.0 * new_tokens, flops=decode_flops,
                bytes_moved=decode_bytes, intensity=decode_flops / decode_bytes,
                achieved_flops=decode_flops / (0.043 * new_tokens)),
    ]
    if compare:
        events.append(KVCompare(cached_ms=tuple(43.0 + (j % 5) * 0.5 for j in range(new_tokens)),
                                uncached_ms=tuple(43.0 + 2.5 * (PROMPT_TOKENS + j) for j in range(new_tokens)),
                                identical=True))
    if sweep:
        sizes = (1, 2, 4, 8, 16)
        ms = (43.0, 45.0, 50.0, 62.0, 90.0)
        # Throughput over the whole sweep run (its prefill included): a little under batch ÷ step time.
        events.append(KVSweep(batch_sizes=sizes, tokens_per_s=tuple(n * 1000 / (m * 1.04) for n, m in zip(
                                  sizes, ms, strict=True)),
                              ms_per_step=ms, kv_bytes=tuple(n * max_length * PER_TOKEN for n in sizes)))
    events.append(RunFinished(token_ids=tuple(range(new_tokens)), text="", stop_reason="max_new_tokens",
                              tokens_per_s=23.0, prefill_ms=150.0, decode_ms=43.0 * new_tokens,
                              prompt_tokens=PROMPT_TOKENS, model_name="SmolLM2", model_path="m", device="cpu",
                              dtype="float32"))
    return events


def of(events: list, kind: type) -> list:
    return [e for e in events if isinstance(e, kind)]


def folded(events: list) -> KVState:
    state = KVState()
    for event in events:
        state.apply(event)
    return state


def as_run(events: list) -> Run:
    return Run.from_events(events)


@pytest.fixture
def view(qtbot) -> KVView:
    configure_pyqtgraph()
    v = KVView()
    qtbot.addWidget(v)
    v.resize(1500, 900)
    v.show()
    return v


def ys(curve) -> list[float]:
    """A curve's data as given (before the plot's log mapping)."""
    return [] if curve.yData is None else list(curve.yData)


def xs(curve) -> list[float]:
    return [] if curve.xData is None else list(curve.xData)


# --- the fold -----------------------------------------------------------------------------------------------
def test_the_fold_equals_a_count_from_the_events():
    events = kv_run(new_tokens=150, holder="paged", sequences=3)  # past two doublings of the series' capacity
    state = folded(events)
    steps = of(events, KVStep)
    assert 2 * FIRST_CAPACITY < 150 == state.count
    assert list(state.steps) == [s.step for s in steps] == list(range(150))
    assert list(state.tokens) == [s.tokens for s in steps]
    assert list(state.total_bytes) == [s.total_bytes for s in steps]
    assert list(state.formula_bytes) == [s.formula_bytes for s in steps]
    assert list(state.process_bytes) == [s.process_bytes for s in steps]
    assert list(state.reserved_bytes) == [0] * 150
    np.testing.assert_array_equal(state.layer_bytes, np.array([s.layer_bytes for s in steps]).T)  # layers × steps
    assert state.layer_bytes.shape == (LAYERS, 150) and state.layers == LAYERS
    assert state.layer_bytes.dtype == np.int64  # bytes stay exact integers
    assert state.prefill_position == 0 and state.prompt_tokens == PROMPT_TOKENS
    assert state.blocks == steps[-1].blocks and state.sequences == 3
    assert state.phases == {p.phase: p for p in of(events, KVPhase)}
    assert state.compare == of(events, KVCompare)[0] and state.sweep == of(events, KVSweep)[0]
    assert state.started == of(events, KVStarted)[0] and state.stop_reason == "max_new_tokens"
    # Capacity doubles (amortised appends), it does not grow by one per step or all at once.
    assert state._total.data.size == 4 * FIRST_CAPACITY and state._layers.data.shape == (LAYERS, 4 * FIRST_CAPACITY)
    # The last block of each sequence holds tokens − (blocks − 1) × block size positions.
    tokens = steps[-1].tokens
    assert state.last_block_fill() == [tokens - (len(t) - 1) * BLOCK for t in steps[-1].blocks.tables]
    # A new run's start forgets the last one.
    state.apply(events[0])
    assert state.count == 0 and state.blocks is None and state.phases == {} and state.compare is None


def test_the_prefill_is_marked_where_it_came_among_the_steps():
    events = kv_run(new_tokens=5)
    prefill = of(events, PrefillDone)[0]
    moved = [e for e in events if e is not prefill]
    moved.insert(moved.index(of(moved, KVStep)[2]), prefill)  # as if the prefill ended after two steps
    assert folded(moved).prefill_position == 2
    assert folded(events).prefill_position == 0


def test_bytes_per_token_and_what_a_contiguous_reserve_holds():
    state = folded(kv_run(new_tokens=20))
    assert state.measured_bytes_per_token() == PER_TOKEN
    assert state.contiguous_reserved_bytes() == (PROMPT_TOKENS + 20) * PER_TOKEN
    ratio = state.compare_ratio()
    c = state.compare
    assert ratio == (c.uncached_ms[-1] / c.cached_ms[-1], sum(c.uncached_ms) / sum(c.cached_ms))
    paged = folded(kv_run(new_tokens=20, holder="paged", sequences=2))
    last = paged.last
    assert paged.measured_bytes_per_token() == last.total_bytes / (last.tokens * 2)


# --- the view -----------------------------------------------------------------------------------------------
def test_the_view_is_registered():
    assert "kv" in view_names()
    assert KVView.consumes == (KVStep,) and KVView.title == "KV cache"


def test_the_size_plot_is_the_measured_bytes_the_formula_and_the_ceilings(view):
    events = kv_run(new_tokens=40, holder="paged", sequences=2, device_reserved=True)  # whole blocks ≠ formula
    view.show_run(as_run(events))
    steps = of(events, KVStep)
    assert xs(view.size_panel.total_curve) == [float(s.step) for s in steps]
    assert ys(view.size_panel.total_curve) == [s.total_bytes / MB for s in steps]
    assert ys(view.size_panel.formula_curve) == [s.formula_bytes / MB for s in steps]
    assert ys(view.size_panel.total_curve) != ys(view.size_panel.formula_curve)
    assert ys(view.size_panel.process_curve) == [s.process_bytes / MB for s in steps]
    assert ys(view.size_panel.reserved_curve) == [s.device_reserved_bytes / MB for s in steps]
    assert ys(view.size_panel.weights_curve) == [WEIGHTS / MB] * 2 and xs(view.size_panel.weights_curve) == [0.0, 39.0]
    assert view.size_panel.formula_curve.opts["pen"].style().name == "DashLine"
    item = view.size_plot.getPlotItem()
    assert item.getAxis("left").isVisible() and "MB" in item.getAxis("left").labelText
    assert item.ctrl.logYCheck.isChecked()  # weights and cache on one readable axis
    assert view.size_panel.prefill_line.isVisible() and view.size_panel.prefill_line.value() == -0.5  # before step 0
    assert "39 prompt tokens" in view.size_panel.prefill_line.label.format
    caption = view.size_panel.caption.text()
    for name in ("KV cache, measured", "formula", "model weights", "process memory", "device memory reserved"):
        assert name in caption


def test_a_contiguous_cache_is_its_formula_and_has_no_device_line(view):
    events = kv_run(new_tokens=5)
    view.show_run(as_run(events))
    size = view.size_panel
    assert ys(size.total_curve) == ys(size.formula_curve) == [s.total_bytes / MB for s in of(events, KVStep)]
    assert not view.size_panel.reserved_curve.isVisible()
    assert "device memory reserved" not in view.size_panel.caption.text()


def test_the_prefill_marker_sits_where_the_prefill_ended(view):
    events = kv_run(new_tokens=6)
    prefill = of(events, PrefillDone)[0]
    moved = [e for e in events if e is not prefill]
    moved.insert(moved.index(of(moved, KVStep)[2]), prefill)  # as if the prefill ended after two steps
    view.show_run(as_run(moved))
    line = view.size_panel.prefill_line
    assert line.isVisible() and line.value() == 1.5  # between steps 1 and 2


def test_the_layer_heatmap_is_each_layers_bytes(view):
    events = kv_run(new_tokens=30, window=16)  # odd rows (layers 2, 4, …) hold 16 positions only
    view.show_run(as_run(events))
    steps = of(events, KVStep)
    expected = np.array([[b / MB for b in s.layer_bytes] for s in steps]).T
    assert not np.array_equal(expected[0], expected[1])
    np.testing.assert_array_equal(view.layer_image.image, expected)  # row 0 = layer 1 (drawn at the bottom)
    rect = view.layer_image.mapRectToParent(view.layer_image.boundingRect())
    assert (rect.left(), rect.top(), rect.width(), rect.height()) == (-0.5, 0.5, 30, LAYERS)
    assert view.layer_colorbar.levels() == (0.0, expected.max())
    last = steps[-1].layer_bytes
    assert f"{format_mb(min(last))} to {format_mb(max(last))} per layer" in view.layer_panel.caption.text()
    view.show_run(as_run(kv_run(new_tokens=30)))
    assert f"{format_mb(of(events, KVStep)[-1].layer_bytes[0])} in each of the 30 layers" in \
        view.layer_panel.caption.text()


def test_the_compare_curves_are_the_measured_latencies(view):
    events = kv_run(new_tokens=25)
    view.show_run(as_run(events))
    compare = of(events, KVCompare)[0]
    assert not view.compare_panel.showing_note and view.compare_panel.plot.isVisible()
    cached = view.compare_panel.cached_curve
    assert ys(cached) == list(compare.cached_ms) and xs(cached) == list(range(25))
    assert ys(view.compare_panel.uncached_curve) == list(compare.uncached_ms)
    last = compare.uncached_ms[-1] / compare.cached_ms[-1]
    assert view.compare_panel.ratio_label.textItem.toPlainText() == f"×{last:.1f}"
    caption = view.compare_panel.caption.text()
    assert f"×{last:.1f}" in caption and f"×{sum(compare.uncached_ms) / sum(compare.cached_ms):.1f}" in caption
    assert "Same tokens" in caption


def block_map(view: KVView) -> tuple[list[tuple[int, ...]], dict[int, str], dict[int, float]]:
    """The tables read back from the drawn cells: per row, the block ids left to right; each block's colour; the
    drawn fill of partly used cells (as a fraction of a cell)."""
    opts = view.block_panel.cells.opts
    rows: dict[int, list[tuple[float, int]]] = {}
    colours: dict[int, str] = {}
    for x0, y0, brush, block, label in zip(opts["x0"], opts["y0"], opts["brushes"], view.block_panel.ids,
                                            view.block_panel.labels, strict=False):
        assert label.textItem.toPlainText() == str(block)
        rows.setdefault(round(y0), []).append((x0, block))
        colours.setdefault(block, brush.color().name())
    fill = view.block_panel.fill.opts
    fills = {}
    for x0, y0, width, brush in zip(fill["x0"], fill["y0"], fill["width"], fill["brushes"], strict=True):
        block = dict((round(x), b) for x, b in rows[round(y0)])[round(x0)]
        fills[block] = width / 0.94
        colours[block] = brush.color().name()
    tables = [tuple(b for _x, b in sorted(rows[r])) for r in sorted(rows)]
    return tables, colours, fills


def test_the_block_map_is_the_block_tables(view):
    events = kv_run(new_tokens=30, holder="paged", sequences=3)
    view.show_run(as_run(events))
    blocks = of(events, KVStep)[-1].blocks
    assert not view.block_panel.showing_note
    tables, colours, fills = block_map(view)
    assert tables == [tuple(t) for t in blocks.tables]
    assert blocks.shared and all(colours[b] == QColor(SHARED_COLOR).name() for b in blocks.shared)
    own = {b for t in blocks.tables for b in t} - set(blocks.shared)
    assert all(colours[b] == QColor(TOTAL_COLOR).name() for b in own)
    # Each sequence's last block drawn as far as it is used, over the grey of its free slots.
    tokens = of(events, KVStep)[-1].tokens
    for table in blocks.tables:
        used = tokens - (len(table) - 1) * BLOCK
        assert fills[table[-1]] == pytest.approx(used / BLOCK)
    cells = view.block_panel.cells.opts["brushes"]
    assert sum(b.color().name() == QColor(FREE_COLOR).name() for b in cells) == len(blocks.tables)
    caption = view.block_panel.caption.text()
    assert f"{blocks.slots_allocated - blocks.slots_used} free" in caption
    assert format_percent(blocks.fragmentation) in caption and f"<b>{blocks.blocks_allocated}</b> blocks" in caption
    panel = view.block_panel
    assert all(label.isVisible() for label in panel.labels[: len(panel.ids)])  # ids fit in the cells


def test_a_contiguous_run_explains_why_there_are_no_blocks(view):
    view.show_run(as_run(kv_run(new_tokens=20)))
    assert view.block_panel.showing_note and not view.block_panel.plot.isVisible()
    note = view.block_panel.note.text()
    assert "Contiguous cache" in note and "max_length = 59" in note
    assert format_mb(59 * PER_TOKEN) in note and format_mb((PROMPT_TOKENS + 19) * PER_TOKEN) in note
    assert view.block_panel.ids == [] and len(view.block_panel.cells.opts["x0"]) == 0


def test_a_run_without_a_cache_says_so(view):
    view.show_run(as_run(kv_run(new_tokens=5, holder="none", compare=False)))
    for panel in (view.block_panel, view.layer_panel):
        assert panel.showing_note and "No cache" in panel.note.text()
    assert "No cache" in view.size_panel.caption.text() and "No cache</b>: nothing held" in view.figures.text()
    assert "measured" not in view.figures.text()
    view.show_run(as_run(kv_run(new_tokens=5)))  # the next run with a cache shows its layers again
    assert not view.layer_panel.showing_note


def test_the_roofline_places_each_phase_at_its_intensity_and_speed(view):
    events = kv_run(new_tokens=30)
    view.show_run(as_run(events))
    phases = {p.phase: p for p in of(events, KVPhase)}
    for name, point in (("prefill", view.roofline_panel.prefill_point), ("decode", view.roofline_panel.decode_point)):
        p = phases[name]
        assert xs(point) == [p.flops / p.bytes_moved] and ys(point) == [p.achieved_flops / 1e9]
        assert xs(point)[0] == pytest.approx(p.intensity)
    assert view.roofline_panel.prefill_label.textItem.toPlainText().startswith("prefill (39 tokens)")
    assert "decode (30 tokens)" in view.roofline_panel.decode_label.textItem.toPlainText()
    item = view.roofline_panel.plot.getPlotItem()
    assert item.ctrl.logXCheck.isChecked() and item.ctrl.logYCheck.isChecked()
    roof_x, roof_y = np.asarray(xs(view.roofline_panel.roof_curve)), np.asarray(ys(view.roofline_panel.roof_curve))
    np.testing.assert_allclose(roof_y, np.minimum(PEAK_FLOPS, PEAK_BW * roof_x) / 1e9)
    assert roof_y.max() == PEAK_FLOPS / 1e9 and PEAK_FLOPS / PEAK_BW in roof_x  # the ridge is on the roof
    roofline = view.roofline_panel
    assert roof_x.min() < min(xs(roofline.decode_point)) and roof_x.max() > max(xs(roofline.prefill_point))
    assert "95 GFLOP/s" in view.roofline_panel.compute_label.textItem.toPlainText()
    assert "23.0 GB/s" in view.roofline_panel.bandwidth_label.textItem.toPlainText()


def test_the_sweep_curves_are_the_measured_batches(view):
    events = kv_run(new_tokens=10)
    view.show_run(as_run(events))
    sweep = of(events, KVSweep)[0]
    assert not view.sweep_panel.showing_note
    assert xs(view.sweep_panel.throughput_curve) == list(sweep.batch_sizes) == xs(view.sweep_panel.step_ms_curve)
    assert ys(view.sweep_panel.throughput_curve) == list(sweep.tokens_per_s)
    assert ys(view.sweep_panel.step_ms_curve) == list(sweep.ms_per_step)
    ticks = view.sweep_plot.getPlotItem().getAxis("bottom")._tickLevels[0]
    assert [label for _v, label in ticks] == [str(n) for n in sweep.batch_sizes]
    caption = view.sweep_panel.caption.text()
    assert f"{sweep.tokens_per_s[-1]:,.0f} tokens/s" in caption and "Batch 16" in caption


def test_a_run_without_compare_or_sweep_shows_notes_not_empty_plots(view):
    view.show_run(as_run(kv_run(new_tokens=10, compare=False, sweep=False)))
    for panel, words in ((view.compare_panel, "compare without cache"), (view.sweep_panel, "batch sweep")):
        assert panel.showing_note and not panel.plot.isVisible() and panel.note.isVisible()
        assert "not" in panel.note.text() and words in panel.note.text()
    assert ys(view.compare_panel.cached_curve) == [] and ys(view.sweep_panel.throughput_curve) == []
    # A comparison that holds no token (stopped at once) is a note too.
    events = kv_run(new_tokens=10, compare=False, sweep=False)
    events.insert(-1, KVCompare(cached_ms=(), uncached_ms=(), identical=True))
    view.show_run(as_run(events))
    assert view.compare_panel.showing_note
    # A later run that has them shows the plots again.
    view.show_run(as_run(kv_run(new_tokens=10)))
    assert not view.compare_panel.showing_note and not view.sweep_panel.showing_note


def test_the_figures_line(view):
    events = kv_run(new_tokens=20)
    view.show_run(as_run(events))
    last = of(events, KVStep)[-1]
    figures = view.figures.text()
    assert f"<b>{last.tokens}</b> tokens held" in figures
    assert "46,080 B measured</b> ✓ 46,080 B by the formula" in figures
    assert format_mb(last.total_bytes) in figures and "weights 538 MB" in figures
    assert format_percent(last.total_bytes / WEIGHTS) in figures and format_mb(last.process_bytes) in figures
    assert "finished (max_new_tokens)" in view.header.text() and "30 layers × 3 KV heads" in view.header.text()


def test_a_cache_that_is_not_the_formula_shows_it(view):
    events = kv_run(new_tokens=20, holder="paged")  # one sequence, whole blocks: more than the formula
    view.show_run(as_run(events))
    last = of(events, KVStep)[-1]
    assert last.total_bytes != last.formula_bytes
    assert f"{last.total_bytes / last.tokens:,.0f} B measured</b> ≠" in view.figures.text()


def plotted(view: KVView) -> dict:
    """Everything the view draws, for comparing two views."""
    curves = {name: (xs(getattr(getattr(view, panel), name)), ys(getattr(getattr(view, panel), name)))
              for panel, names in (("size_panel", ("total_curve", "formula_curve", "process_curve", "weights_curve")),
                                   ("compare_panel", ("cached_curve", "uncached_curve")),
                                   ("roofline_panel", ("prefill_point", "decode_point", "roof_curve")),
                                   ("sweep_panel", ("throughput_curve", "step_ms_curve")))
              for name in names}
    return {**curves, "image": view.layer_image.image.tolist(), "blocks": block_map(view),
            "texts": [w.text() for w in (view.header, view.figures, view.block_panel.caption,
                                         view.compare_panel.caption, view.roofline_panel.caption,
                                         view.sweep_panel.caption)],
            "prefill": view.size_panel.prefill_line.value()}


def test_live_in_batches_equals_the_saved_trace(qtbot, tmp_path, view):
    events = kv_run(new_tokens=40, holder="paged", sequences=2)
    run = Run(index=0, settings=as_run(events).settings)
    for start in range(0, len(events), 3):  # live: small batches, as the window sends them
        batch = events[start : start + 3]
        for event in batch:
            run.apply(event)
        view.apply(run, batch)
        view.flush()
    view.end(run)
    live = plotted(view)
    assert len(live["total_curve"][1]) == 40 and live["blocks"][0]

    write_trace(events, tmp_path / "kv.jsonl")
    saved = read_trace(tmp_path / "kv.jsonl")
    assert not saved.skipped and not saved.truncated and saved.events == events
    again = KVView()
    qtbot.addWidget(again)
    again.resize(1500, 900)
    again.show()
    again.show_run(as_run(saved.events))
    assert plotted(again) == live


def test_a_stopped_run_does_not_look_running(view):
    events = kv_run(new_tokens=10)
    run = as_run(events[:12])  # no RunFinished
    run.error = "stopped by the user"
    view.show_run(run)
    assert "failed" in view.header.text() and "running" not in view.header.text()
    assert view.compare_panel.showing_note and "was not measured" in view.compare_panel.note.text()


def test_the_picture_is_not_blank(view):
    view.show_run(as_run(kv_run(new_tokens=40, holder="paged", sequences=3)))
    image = view.grab().toImage()
    assert image.width() >= 1500
    colours = {image.pixelColor(x, y).name() for x in range(0, image.width(), 7) for y in range(0, image.height(), 7)}
    for colour in (TOTAL_COLOR, SHARED_COLOR):
        assert QColor(colour).name() in colours


# --- real runs ----------------------------------------------------------------------------------------------
def kv_strategy_ready() -> bool:
    from playground.config.catalog import get_strategy

    try:
        get_strategy("kv-cache")
    except ConfigError:
        return False
    return True


needs_strategy = pytest.mark.skipif(not kv_strategy_ready(), reason="the kv-cache strategy is not registered yet")


@pytest.fixture(scope="module")
def real_runs(tiny_lm) -> dict[str, list]:
    """A contiguous run compared with recomputation, a paged one with a batch sweep, and one with no cache."""
    flats = {"contiguous": {}, "paged": {"paged": True, "block_size": 4, "batch_sweep": "1,2,4",
                                         "compare_no_cache": False},
             "none": {"no_cache": True, "compare_no_cache": False}}
    return {name: list(run_strategy(tiny_lm, RunSettings.from_flat(strategy="kv-cache", prompt=PROMPT,
                                                                   max_new_tokens=12, **flat)))
            for name, flat in flats.items()}


@needs_strategy
def test_a_real_run_is_folded_and_drawn_as_it_came(real_runs, view):
    for name, events in real_runs.items():
        view.show_run(as_run(events))
        steps = of(events, KVStep)
        assert steps and view.state.count == len(steps) == len(of(events, TokenStep))
        assert ys(view.size_panel.total_curve) == [s.total_bytes / MB for s in steps]
        assert ys(view.size_panel.formula_curve) == [s.formula_bytes / MB for s in steps]
        if name != "none":  # (a run with no cache shows a note in place of the heatmap)
            np.testing.assert_array_equal(view.layer_image.image, np.array([s.layer_bytes for s in steps]).T / MB)
        # The step's bytes are the token event's that follows it.
        assert [s.total_bytes for s in steps] == [t.kv_cache_bytes for t in of(events, TokenStep)]
        started = of(events, KVStarted)[0]
        assert view.state.holder == started.holder == name
        if name == "contiguous":  # the cache holds exactly what the formula counts
            assert ys(view.size_panel.total_curve) == ys(view.size_panel.formula_curve)
            assert "✓" in view.figures.text()
            assert view.block_panel.showing_note and "Contiguous cache" in view.block_panel.note.text()
            compare = of(events, KVCompare)[0]
            assert ys(view.compare_panel.cached_curve) == list(compare.cached_ms)
            assert ys(view.compare_panel.uncached_curve) == list(compare.uncached_ms)
            assert view.sweep_panel.showing_note
        elif name == "paged":
            blocks = steps[-1].blocks
            assert blocks is not None and block_map(view)[0] == [tuple(t) for t in blocks.tables]
            sweep = of(events, KVSweep)[0]
            assert xs(view.sweep_panel.throughput_curve) == list(sweep.batch_sizes) == [1, 2, 4]
            assert view.compare_panel.showing_note
        else:
            assert view.block_panel.showing_note and "No cache" in view.block_panel.note.text()
        for phase in of(events, KVPhase):
            point = view.roofline_panel.prefill_point if phase.phase == "prefill" else view.roofline_panel.decode_point
            if phase.bytes_moved > 0 and phase.achieved_flops > 0:
                assert xs(point) == [phase.flops / phase.bytes_moved]
                assert ys(point) == [phase.achieved_flops / 1e9]


@needs_strategy
def test_a_real_run_live_in_batches_equals_its_saved_trace(real_runs, tmp_path, qtbot, view):
    events = real_runs["paged"]
    run = Run(index=0, settings=as_run(events).settings)
    for start in range(0, len(events), 4):
        batch = events[start : start + 4]
        for event in batch:
            run.apply(event)
        view.apply(run, batch)
        view.flush()
    view.end(run)
    write_trace(events, tmp_path / "kv.jsonl")
    saved = read_trace(tmp_path / "kv.jsonl")
    assert not saved.skipped and not saved.truncated
    again = KVView()
    qtbot.addWidget(again)
    again.resize(1500, 900)
    again.show()
    again.show_run(as_run(saved.events))
    assert plotted(again) == plotted(view)


@needs_strategy
def test_the_window_brings_the_kv_view_to_the_front(qtbot, tmp_path, tiny_lm):
    from PySide6.QtCore import Qt

    settings = RunSettings.from_flat(strategy="kv-cache", prompt=PROMPT, max_new_tokens=6, compare_no_cache=False)
    w = open_window(qtbot, tmp_path, tiny_lm, settings)
    qtbot.mouseClick(w.generate_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not w.busy, timeout=20000)
    run = w.session.runs[0]
    assert run.finished is not None and run.error is None
    assert w.docks["kv"].pages.currentWidget() is w.views["kv"]
    view = w.views["kv"]
    assert view.state.count == len(run.steps) and ys(view.size_panel.total_curve) == [
        s.total_bytes / MB for s in of(run.events, KVStep)]
