"""A saved run replayed step by step through the views, as it streamed: the frames of an animation, and the steps
a presenter walks forward and back.

The events are cut into frames: the first holds what came before the first step (the prompt), each later one a
step's events (its unit step and what was recorded with it). Going forward folds the next frames' events into the
replayed run and hands them to the views exactly as a live run's batches are; going back rebuilds the run from
the saved events up to that frame and shows it afresh.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import QCoreApplication, QTimer
from PySide6.QtWidgets import QWidget

from playground.events import PrefillDone, RunStarted, is_step_event, is_unit_step
from playground.state import Run
from playground.ui.run_views import RunViews
from playground.ui.views.base import View

HOLD_LAST_MS = 2000.0  # how long an animation's last frame stays before it loops


@dataclass(frozen=True)
class Frame:
    """Events ``[start, end)`` of the run; ``step``: the step they end on (None: the prompt, before any step);
    ``recorded_ms``: how long the run took to reach the next frame (the next step's time), the last one's hold."""

    start: int
    end: int
    step: int | None
    recorded_ms: float


def cut_frames(events: Sequence[Any]) -> list[Frame]:
    """The frames of ``events`` (a saved run, its start event first)."""
    bounds: list[tuple[int, int | None]] = [(0, None)]  # (first event, the step it shows)
    current_has_unit = False
    for index, event in enumerate(events):
        if not is_step_event(event):
            continue
        step = bounds[-1][1]
        if (current_has_unit and event.step != step) or step is None:
            bounds.append((index, event.step))
            current_has_unit = False
        if is_unit_step(event):
            current_has_unit = True
    prefill_ms = next((e.prefill_ms for e in events if isinstance(e, PrefillDone)), 0.0)
    frames = []
    for k, (start, step) in enumerate(bounds):
        end = bounds[k + 1][0] if k + 1 < len(bounds) else len(events)
        if k + 1 < len(bounds):
            next_end = bounds[k + 2][0] if k + 2 < len(bounds) else len(events)
            ms = sum(e.step_ms for e in events[end:next_end] if is_unit_step(e)) + (prefill_ms if k == 0 else 0.0)
        else:
            ms = HOLD_LAST_MS
        frames.append(Frame(start, end, step, ms))
    return frames


def settle(widget: QWidget) -> None:
    """Draw now what the views hold back while a run streams (their throttles wait on timers): a frame must show
    every event folded into it, also in a view whose tab is behind another's."""
    QCoreApplication.processEvents()
    for view in [widget, *widget.findChildren(View)]:
        if isinstance(view, View):
            view.catch_up()
    for _ in range(4):
        active = [timer for timer in widget.findChildren(QTimer) if timer.isActive() and timer.isSingleShot()]
        if not active:
            break
        for timer in active:
            timer.stop()
            timer.timeout.emit()
        QCoreApplication.processEvents()
    for _ in range(3):  # a label whose new text wraps differently asks for its height over more than one pass
        QCoreApplication.processEvents()


class Replay:
    """``events`` (a saved run) shown in ``run_views`` up to a frame; ``position`` is the frame shown (-1: none)."""

    def __init__(self, run_views: RunViews, events: Sequence[Any], *, index: int = 0, source: str | None = None,
                 settle_in: QWidget | None = None, on_shown: Callable[[Run], None] | None = None) -> None:
        if not events or not isinstance(events[0], RunStarted):
            raise ValueError("a replay needs a saved run whose first event is its start")
        self.run_views, self.events, self.index, self.source = run_views, list(events), index, source
        self.frames = cut_frames(self.events)
        self.settle_in, self.on_shown = settle_in, on_shown
        self.run: Run | None = None
        self.position = -1

    def __len__(self) -> int:
        return len(self.frames)

    def show(self, position: int) -> Run:
        """Frame ``position`` (clamped to the frames) in the views; returns the replayed run as it stands there."""
        position = max(0, min(len(self.frames) - 1, position))
        if self.run is None or position < self.position:
            self._rebuild(position)
        else:
            for k in range(self.position + 1, position + 1):
                frame = self.frames[k]
                batch = self.events[frame.start:frame.end]
                for event in batch:
                    self.run.apply(event)
                self.run_views.apply(self.run, batch)
        self.position = position
        assert self.run is not None
        if position == len(self.frames) - 1 and self.run.finished is None:
            self.run.error = "the saved trace ends before the run did"
            self.run_views.end(self.run)
        if self.on_shown is not None:
            self.on_shown(self.run)
        if self.settle_in is not None:
            settle(self.settle_in)
        return self.run

    def _rebuild(self, position: int) -> None:
        settings_event = self.events[0]
        from playground.config import RunSettings

        settings, _unknown = RunSettings.from_plain_dict(settings_event.settings)
        run = Run(index=self.index, settings=settings, source=self.source)
        for event in self.events[:self.frames[position].end]:
            run.apply(event)
        self.run = run
        self.run_views.show(run)
