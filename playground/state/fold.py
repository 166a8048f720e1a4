"""The base of the views' folds: what every fold keeps of its run, and which of its parts changed.

A fold turns a run's events into what one view shows. What all of them share lives here, once: ``RunStarted``
resets the fold, the strategy's own start event (``start_event``) is kept as ``started``, ``RunFinished`` brings the
stop reason, the decode speed and the end-of-run figures, ``end(status)`` marks a run that ended without it (failed,
stopped), ``ended`` says whether the run is over, and ``status`` is the run's state in words. A subclass keeps only
what is its own: ``_clear`` (its fields, on reset), ``_fold`` (one of its events in), and where it needs them
``_run_started`` and ``_finished``.

A fold says what changed: it names its parts (``parts``: the pieces of its state a view draws separately) and every
event adds the parts it changed to ``dirty``; ``STATUS`` (the run's start, end, speed and figures, and counts a
header shows) is every fold's. A view draws the dirty parts' panels and then clears ``dirty`` (``take_dirty``);
nothing dirty: nothing to draw. A reset makes every part dirty (a new run is drawn whole).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

from playground.events import Event, RunFinished, RunStarted

STATUS = "status"  # every fold's part: the run's start and end, its speed and figures, what a header counts


class Fold:
    """Base of the views' folds. ``apply(event)`` folds one event in and says whether it was one of this fold's."""

    parts: ClassVar[frozenset[str]] = frozenset()  # a subclass's own parts (``STATUS`` is everyone's)
    start_event: ClassVar[type | None] = None  # the strategy's start event, kept as ``started`` (None: none)

    started: object | None
    figures: dict[str, float]
    tokens_per_s: float | None
    stop_reason: str | None
    ended_status: str | None
    dirty: set[str]

    def __init__(self) -> None:
        self.reset()

    @classmethod
    def all_parts(cls) -> frozenset[str]:
        return cls.parts | {STATUS}

    def reset(self) -> None:
        self.started = None
        self.figures = {}
        self.tokens_per_s = None
        self.stop_reason = None  # from RunFinished
        self.ended_status = None  # how a run without RunFinished ended ("failed", "stopped")
        self.dirty = set(self.all_parts())
        self._clear()

    # --- what a subclass adds -------------------------------------------------------------------------------
    def _clear(self) -> None:
        """Reset the subclass's own fields."""

    def _run_started(self, event: RunStarted) -> None:
        """The run's start (after the reset): what a subclass reads of it."""

    def _fold(self, event: Event) -> Iterable[str] | None:
        """One event that is neither the run's start nor its end: the parts it changed (None or empty: not ours)."""
        return None

    def _finished(self, event: RunFinished) -> Iterable[str]:
        """The run's end (its figures and stop reason already kept): the parts it changed besides ``STATUS``."""
        return self.parts

    # --- folding --------------------------------------------------------------------------------------------
    def apply(self, event: Event) -> bool:
        """Fold one event in; True when it changed this fold (its parts are then in ``dirty``)."""
        if isinstance(event, RunStarted):
            self.reset()
            self._run_started(event)
            return True
        if isinstance(event, RunFinished):
            self.figures = dict(event.figures)
            self.tokens_per_s = event.tokens_per_s
            self.stop_reason = event.stop_reason
            self.ended_status = None
            changed = set(self._finished(event))
            self.dirty |= changed | {STATUS}
            return bool(changed)
        start = self.start_event
        if start is not None and isinstance(event, start):
            self.started = event
        changed = set(self._fold(event) or ())
        if start is not None and isinstance(event, start):
            self.dirty |= self.all_parts()
            return True
        if not changed:
            return False
        self.dirty |= changed
        return True

    def end(self, status: str) -> None:
        """A run that ended without RunFinished (failed, stopped); a no-op after one."""
        if self.stop_reason is None:
            self.ended_status = status
            self.dirty |= self.all_parts()
            self._ended_without_finish()

    def _ended_without_finish(self) -> None:
        """A subclass's own end for a run without RunFinished (e.g. settle what is pending)."""

    def take_dirty(self) -> set[str]:
        """The parts changed since the last call (and none from now on until events come)."""
        dirty, self.dirty = self.dirty, set()
        return dirty

    # --- reading --------------------------------------------------------------------------------------------
    @property
    def ended(self) -> bool:
        """RunFinished came, or the run was marked as ended without one."""
        return self.stop_reason is not None or self.ended_status is not None

    def status(self, waiting: str = "running…", under_way: bool = True) -> str:
        """The run's state in words: "finished (eos)", how it ended without finishing, or ``"running…"`` once it is
        ``under_way`` (``waiting`` before: e.g. "waiting for the first token…")."""
        if self.stop_reason:
            return f"finished ({self.stop_reason})"
        if self.ended_status:
            return self.ended_status
        return "running…" if under_way else waiting
