"""What keeps the GUI thread's work per streamed token down draws exactly what the plain way draws.

The tokens chart's axes keep their drawings by what a drawing depends on (``KeptPicturesAxis``) and measure each
label once (``LabelsAxis``); each is checked here against a plain pyqtgraph axis given the same ranges and ticks,
pixel for pixel, over a sequence that comes back to earlier states and leaves them. The GUI-thread collector
freezes what was alive at a job's start and hands it back at the end.
"""

from __future__ import annotations

import gc

import pyqtgraph as pg
import pytest
from PySide6.QtGui import QImage, QPainter

from playground.ui import gui_gc
from playground.ui.style import configure_pyqtgraph
from playground.ui.views.drawing import KeptPicturesAxis, LabelsAxis
from playground.ui.worker import GeneratorJob

# (x range, left ticks): states a streaming chart passes through, coming back to some of them.
TICKS_A = [[(0, "▶ ␣the"), (1, "␣a"), (2, "␣city"), (3, "(rest of vocabulary)")]]
TICKS_B = [[(0, "▶ ␣sky"), (1, "␣ocean"), (2, "␣iii"), (3, "␣WWW")]]  # as many rows as A: the same y range
TICKS_C = [[(0, "▶ ␣www"), (1, "␣a"), (2, "␣WWW"), (3, "␣iii")]]
STATES = [((0, 120), TICKS_A), ((0, 50), TICKS_A), ((0, 120), TICKS_B), ((0, 120), TICKS_A), ((0, 50), TICKS_B),
          ((0, 50), TICKS_A), ((0, 120), TICKS_A), ((0, 120), TICKS_C), ((0, 50), TICKS_C)]


def _plot(qtbot, left: pg.AxisItem, bottom: pg.AxisItem) -> pg.PlotWidget:
    plot = pg.PlotWidget(axisItems={"left": left, "bottom": bottom})
    item = plot.getPlotItem()
    item.hideButtons()
    item.invertY(True)
    item.showGrid(x=True, y=False, alpha=0.25)
    item.getAxis("left").setWidth(150)
    for side in ("left", "bottom"):
        item.getAxis(side).enableAutoSIPrefix(False)
    qtbot.addWidget(plot)
    plot.resize(500, 400)
    plot.show()
    qtbot.waitExposed(plot)
    return plot


def _draw(plot: pg.PlotWidget, x_range: tuple[float, float], ticks: list) -> QImage:
    item = plot.getPlotItem()
    item.getAxis("left").setTicks(ticks)
    item.setXRange(*x_range, padding=0)
    item.setYRange(-0.6, len(ticks[0]) - 0.4, padding=0)
    return plot.grab().toImage()


class CountedKept(KeptPicturesAxis):
    """Counts its layouts (each is a ``generateDrawSpecs``)."""

    layouts = 0

    def generateDrawSpecs(self, p):
        CountedKept.layouts += 1
        return super().generateDrawSpecs(p)


class CountedLabels(LabelsAxis):
    layouts = 0

    def generateDrawSpecs(self, p):
        CountedLabels.layouts += 1
        return super().generateDrawSpecs(p)


@pytest.mark.parametrize("axis_class", [KeptPicturesAxis, LabelsAxis])
def test_a_kept_axis_draws_every_state_as_a_plain_axis_does(qtbot, axis_class):
    configure_pyqtgraph()
    plain = _plot(qtbot, pg.AxisItem("left"), pg.AxisItem("bottom"))
    kept = _plot(qtbot, axis_class("left"), axis_class("bottom"))
    for x_range, ticks in STATES:
        expected = _draw(plain, x_range, ticks)
        assert _draw(kept, x_range, ticks) == expected, (x_range, ticks)


def _specs(axis: pg.AxisItem) -> list:
    """The axis's layout as pyqtgraph computes it: where each label goes (and the lines), comparable."""
    image = QImage(600, 500, QImage.Format.Format_ARGB32_Premultiplied)
    painter = QPainter(image)
    try:
        _, tick_specs, text_specs = axis.generateDrawSpecs(painter)
    finally:
        painter.end()
    return [(rect.getRect(), int(flags), text) for rect, flags, text in text_specs] + [
        (p1.x(), p1.y(), p2.x(), p2.y()) for _, p1, p2 in tick_specs]


def test_a_labels_axis_lays_its_labels_out_as_a_plain_axis_does(qtbot):
    """Each label measured once, by font and text: the same rectangles as measuring it every time."""
    configure_pyqtgraph()
    plain = _plot(qtbot, pg.AxisItem("left"), pg.AxisItem("bottom"))
    kept = _plot(qtbot, LabelsAxis("left"), LabelsAxis("bottom"))
    for x_range, ticks in STATES:
        _draw(plain, x_range, ticks)
        _draw(kept, x_range, ticks)
        for side in ("left", "bottom"):
            assert _specs(kept.getPlotItem().getAxis(side)) == _specs(plain.getPlotItem().getAxis(side)), side


def test_a_state_drawn_before_is_played_again_not_laid_out_again(qtbot):
    configure_pyqtgraph()
    plot = _plot(qtbot, CountedKept("left"), CountedLabels("bottom"))
    seen: set = set()
    for x_range, ticks in STATES:
        CountedKept.layouts = CountedLabels.layouts = 0
        _draw(plot, x_range, ticks)
        # The left axis depends on its ticks (and the y range they set), the bottom one on the x range.
        assert CountedKept.layouts == (0 if str(ticks) in {t for _, t in seen} else 1), ticks
        assert CountedLabels.layouts == (0 if x_range in {r for r, _ in seen} else 1), x_range
        seen.add((x_range, str(ticks)))


def test_a_resized_plot_is_laid_out_again(qtbot):
    configure_pyqtgraph()
    plain = _plot(qtbot, pg.AxisItem("left"), pg.AxisItem("bottom"))
    kept = _plot(qtbot, LabelsAxis("left"), LabelsAxis("bottom"))
    x_range, ticks = STATES[0]
    _draw(kept, x_range, ticks)
    for plot in (plain, kept):
        plot.resize(420, 300)
    qtbot.waitUntil(lambda: kept.size().width() == 420)
    assert _draw(kept, x_range, ticks) == _draw(plain, x_range, ticks)


def test_a_job_freezes_what_was_alive_at_its_start_and_hands_it_back_at_its_end(qtbot):
    """A full collection while a job runs scans only what the job's time made (not torch's and the window's
    objects); after the job, the collector sees everything again."""
    gc.unfreeze()  # the suite's conftest freezes between tests: start from what the app sees
    assert gc.get_freeze_count() == 0
    before: list = [[]]  # tracked by the collector
    gc.collect()
    release = []

    def body(should_stop, progress):
        while not release and not should_stop():
            yield None

    job = GeneratorJob(body)
    job.start()
    try:
        assert gui_gc.gui_thread_collects()
        assert gc.get_freeze_count() > 0
        assert not any(o is before for o in gc.get_objects())  # frozen: in none of the generations
    finally:
        release.append(True)
        with qtbot.waitSignal(job.finished, timeout=10_000):
            pass
    assert gc.get_freeze_count() == 0 and gc.isenabled()


def test_a_freeze_made_by_someone_else_is_left_alone(qtbot):
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    job = GeneratorJob(lambda should_stop, progress: iter([1]))
    with qtbot.waitSignal(job.finished, timeout=10_000):
        job.start()
    # Not unfrozen (0) and not frozen again (the job and its timer, made since, would join it); a few frozen
    # objects may die meanwhile (a deferred delete), which lowers the count: 2 of 620,933 did in one full run.
    assert frozen - 100 <= gc.get_freeze_count() <= frozen


def test_while_a_job_runs_the_gil_changes_hands_in_short_turns(qtbot):
    import sys

    from playground.ui import switch_interval

    before = sys.getswitchinterval()
    assert before > switch_interval.JOB_INTERVAL_S  # Python's own 5 ms
    release = []
    seen = []

    def body(should_stop, progress):
        seen.append(sys.getswitchinterval())  # on the job's thread
        while not release and not should_stop():
            yield None

    job = GeneratorJob(body)
    job.start()
    try:
        assert sys.getswitchinterval() == switch_interval.JOB_INTERVAL_S
        qtbot.waitUntil(lambda: bool(seen), timeout=10_000)
        assert seen == [switch_interval.JOB_INTERVAL_S]
    finally:
        release.append(True)
        with qtbot.waitSignal(job.finished, timeout=10_000):
            pass
    assert sys.getswitchinterval() == before
