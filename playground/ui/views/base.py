"""The view interface: what the window knows of every view.

A view draws one kind of run (chosen by the per-step events it draws, never by strategy name), from the events
recorded for it — live or from a saved trace. The window calls ``show_run`` when a run is selected, ``apply`` with
each batch of new events of the shown run, ``flush`` once per batch, and ``end`` when the shown run ends.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, TypeGuard

from PySide6.QtCore import QPoint, QRectF, QSize, Signal
from PySide6.QtGui import QPainter, QPixmap
from PySide6.QtWidgets import QLabel, QWidget

from playground.config.catalog import STRATEGIES
from playground.events import Event, RunStarted
from playground.state import Run
from playground.state.fold import Fold
from playground.ui.views.columns import Panel
from playground.ui.views.drawing import ThrottledDraw

IMAGE_FORMATS = ("png", "svg")


def is_remote_run(run: Run | None) -> TypeGuard[Run]:
    """Whether ``run`` was streamed from a server (it then holds no logits, layers or cache of the model)."""
    return run is not None and run.started is not None and run.started.remote


def remote_engine(run: Run) -> str:
    """The engine that decoded a remote run ("llama.cpp", "vllm", "generic"), as its start event names it."""
    device = run.started.device if run.started is not None else ""
    return device.partition(":")[2].strip() or "an engine"


def needs_local_model_text(view: View, run: Run | None) -> str | None:
    """Why ``view`` is empty for a remote run it does not apply to (None for a local run, or a view that applies)."""
    if not is_remote_run(run) or view.applies_to(run):
        return None
    text = (f"{view.title} needs a local model: run #{run.index + 1} was decoded by {remote_engine(run)} at a "
            "server, which does not expose the model's insides (a server streams each chosen token with its top "
            "candidates only: no logits of other sequences, hidden layers, KV cache or weights). Load a model on "
            "the left to use this view.")
    note = view.remote_note(run)
    return f"{note}\n\n{text}" if note else text


class ExportError(ValueError):
    """An export that cannot be written; the message says why."""


class View(QWidget):
    """Base of every view. Subclasses set ``name``, ``title``, ``consumes`` and draw events."""

    name: ClassVar[str] = ""  # short id: --view NAME, saved layouts, presets
    title: ClassVar[str] = ""  # the dock's title
    consumes: ClassVar[tuple[type, ...]] = ()  # per-step event types this view draws
    data_formats: ClassVar[tuple[str, ...]] = ()  # exports besides the picture (e.g. "csv")
    # Step mode: the view lets the user pick a waiting step's token (it has ``ask_choice(step)`` and the signals
    # ``choice_made(token_id)`` and ``run_on_requested()``).
    picks_tokens: ClassVar[bool] = False
    behind = False  # its dock is a tab behind another (``set_behind``): streaming draws may wait
    # Live steering: the view has a strength slider (the signal ``strength_requested(float)``); the window sets the
    # running run's live strength from it (``playground.config.steering.LiveStrength``).
    sets_strength: ClassVar[bool] = False
    attributes: ClassVar[bool] = False  # signal ``attribution_requested(step, against)``: the window attributes it
    # On-demand salience: the view asks for a step's maps (the signal ``salience_requested(int)``); the window runs
    # them as a job on the shown run (``playground.ui.salience_job``).
    explains_steps: ClassVar[bool] = False

    branch_requested = Signal(int, int)  # step, token id: continue the shown run from there
    # step, token id: "why did the run choose its token at this step and not that one?" The window hands it to the
    # view that explains it (``explain_alternative``) and brings that view to the front.
    why_requested = Signal(int, int)

    def applies_to(self, run: Run) -> bool:
        """Whether this view has something to show for ``run``: its strategy yields (or it holds) our events."""
        kinds = set(run.step_kinds)
        strategy = STRATEGIES.get(run.settings.strategy)
        if strategy is not None:
            kinds.update(strategy.step_events)
        return any(issubclass(kind, self.consumes) for kind in kinds)

    def explain_alternative(self, step: int, against: int) -> bool:
        """Show why the shown run chose its token at ``step`` and not the token ``against`` (a ``why_requested``
        from another view); True where this view does (the window then brings it to the front)."""
        return False

    def remote_note(self, run: Run) -> str:
        """What this view can still say about a server's run it cannot draw (e.g. the server's own KV figures)."""
        return ""

    def wants_front(self, run: Run) -> bool:
        """Whether ``run`` asked for this view beyond what its strategy yields (a recording the user switched on,
        e.g. the logit lens): the window then brings it to the front instead of the strategy's own view."""
        return False

    def empty_text(self, run: Run | None) -> str:
        """What the dock says when this view has nothing to show for ``run``."""
        remote = needs_local_model_text(self, run)
        if remote is not None:
            return remote
        if run is None:
            return f"The {self.title.lower()} shows a run here once there is one."
        return f"Run #{run.index + 1} ({run.settings.strategy}) has nothing for the {self.title.lower()}."

    # --- what the window calls --------------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget the shown run."""

    def apply(self, run: Run, events: list[Event]) -> None:
        """New events of ``run`` (already folded into it): update the view's state, draw later in ``flush``."""

    def flush(self) -> None:
        """Draw what ``apply`` collected (called once per batch, at most ~30 times a second)."""

    def set_behind(self, behind: bool) -> None:
        """Its dock became a tab behind another (``behind``) or came to the front. A view may hold its streaming
        draws while behind (nobody sees them, and on a 2-core CPU each is taken from the model); coming to the
        front, it draws what it held (``catch_up``)."""
        self.behind = behind
        if not behind:
            self.catch_up()

    def catch_up(self) -> None:
        """Draw now what was held while the view was behind (before a picture of it is taken, or as it comes to
        the front)."""

    def end(self, run: Run) -> None:
        """``run`` ended (finished, failed, stopped or truncated): it must not look like it is still running."""

    def show_run(self, run: Run) -> None:
        """Show a recorded run from its events."""
        self.reset()
        self.apply(run, list(run.events))
        self.flush()
        if not run.running:
            self.end(run)

    # --- pictures and data --------------------------------------------------------------------------------
    def paint_overlay(self, pixmap: QPixmap, origin: QWidget) -> None:
        """Screenshots: draw what a user would see floating over this view (a hover tooltip) into ``pixmap``,
        a grab of ``origin``."""

    def export_data(self, path: Path) -> None:
        raise ExportError(f"the {self.title.lower()} exports no data")

    def export(self, path: str | Path) -> Path:
        """Write the view as PNG or SVG, or its data (``data_formats``), chosen by the file's extension."""
        path = Path(path)
        suffix = path.suffix.lower().lstrip(".")
        path.parent.mkdir(parents=True, exist_ok=True)
        if suffix in self.data_formats:
            self.export_data(path)
        elif suffix in IMAGE_FORMATS:
            self.catch_up()
            save_widget_picture(self, path)
        else:
            formats = ", ".join(f".{f}" for f in (*IMAGE_FORMATS, *self.data_formats))
            kind = path.suffix or "a file with no extension"
            raise ExportError(f"cannot export the {self.title.lower()} as {kind}: use {formats}")
        return path


class FoldView(View):
    """A view drawn from Qt-free folds of its events (``self.state``, a ``playground.state.fold.Fold``), redrawn at
    once when a run is shown and at most every ``live_draw_ms`` while it streams, and then only where it changed.

    A subclass sets ``self.state`` and calls ``_start_drawing()`` at the end of its ``__init__`` (which resets it);
    it lists its panels in ``sections`` (``columns.Panel``s: each is drawn when a part of the fold it shows
    changed), or draws itself whole in ``_draw`` (then whenever anything changed). Nothing changed since the last
    draw (a batch of events none of its folds keeps): nothing is drawn. It adds what it keeps besides the fold in
    ``_forget`` (on reset, before the draw), ``_follow`` (before each batch's draw) and ``_ended`` (when the run
    ends, before the last draw), and ``idle_header``, the header's text while nothing is shown. A view whose events
    go to more than its one fold names them in ``_folds``; one whose fold ends another way overrides ``_fold`` (one
    event in), ``_streaming`` (whether the run still streams: draws stay throttled) and ``_end_fold`` (the run ended
    with this status)."""

    live_draw_ms: ClassVar[int] = 200
    idle_header: ClassVar[str] = ""
    state: Any  # the view's fold (a ``Fold``; each view names its own type)
    sections: tuple[Panel, ...] = ()  # the view's panels, where it has them (each drawn where its parts changed)
    header: QLabel  # where ``idle_header`` is set

    def _start_drawing(self) -> None:
        self._redraw = ThrottledDraw(self, self.live_draw_ms, self._draw_changed)
        self.reset()

    def _draw(self) -> None:
        """The whole view: every panel (a view without ``sections`` draws itself)."""
        if not self.sections:
            raise NotImplementedError
        for section in self.sections:
            section.draw()

    def _draw_parts(self, parts: set[str]) -> None:
        """Draw what shows ``parts`` of the folds (called only when some changed): the panels that show one of
        them; a view without ``sections``, whole."""
        if not self.sections:
            self._draw()
            return
        for section in self.sections:
            if section.shows & parts:
                section.draw()

    def _folds(self) -> tuple[Fold, ...]:
        return (self.state,)

    def _changed(self) -> bool:
        return any(fold.dirty for fold in self._folds())

    def _take_changed(self) -> set[str]:
        parts: set[str] = set()
        for fold in self._folds():
            parts |= fold.take_dirty()
        return parts

    def _draw_changed(self) -> None:
        """The streaming redraw: the panels of what changed since the last draw, nothing if nothing did."""
        parts = self._take_changed()
        if parts:
            self._draw_parts(parts)

    def _draw_all(self) -> None:
        self._take_changed()
        self._draw()

    def _forget(self) -> None:
        """Reset what the view keeps besides its fold."""

    def _follow(self) -> None:
        """Before a batch is drawn: e.g. keep the newest step selected."""

    def _ended(self) -> None:
        """The run ended (its fold knows): e.g. stop following the newest step."""

    def _fold(self, event: Event) -> None:
        self.state.apply(event)

    def _streaming(self) -> bool:
        return not self.state.ended

    def _end_fold(self, status: str) -> None:
        if not self.state.ended:
            self.state.end(status)

    def reset(self) -> None:
        self._redraw.cancel()
        for fold in self._folds():
            fold.reset()
        self._forget()
        self._draw_all()
        if self.idle_header:
            self.header.setText(self.idle_header)

    def apply(self, run: Run, events: list[Event]) -> None:
        for event in events:
            if isinstance(event, RunStarted):
                self.reset()
            self._fold(event)

    def flush(self) -> None:
        self._follow()
        if self._changed() and not self.behind:  # behind a tab: drawn when it comes to the front
            self._redraw.request(streaming=self._streaming())

    def catch_up(self) -> None:
        if self._changed():
            self._redraw.cancel()
            self._draw_changed()

    def end(self, run: Run) -> None:
        self._redraw.cancel()
        self._end_fold(run.status)
        self._ended()
        self._draw_all()


def save_widget_picture(widget: QWidget, path: Path, pixmap: QPixmap | None = None) -> None:
    """PNG (a grab, or ``pixmap``) or SVG (the widget painted as vectors) by the file's extension."""
    if path.suffix.lower() == ".svg":
        from PySide6.QtSvg import QSvgGenerator

        size: QSize = widget.size()
        generator = QSvgGenerator()
        generator.setFileName(str(path))
        generator.setSize(size)
        generator.setViewBox(QRectF(0, 0, size.width(), size.height()))
        generator.setTitle(widget.windowTitle() or "Decoding Playground")
        painter = QPainter(generator)
        widget.render(painter, QPoint(0, 0))
        painter.end()
    else:
        picture = pixmap if pixmap is not None else widget.grab()
        if not picture.save(str(path)):
            raise ExportError(f"could not write {path}")
    if not path.is_file() or path.stat().st_size == 0:
        raise ExportError(f"could not write {path}")
