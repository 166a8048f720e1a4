"""Which views show the selected run, and every call into them.

Every view that applies to the run shows it, the others say in their dock why they are empty; a view whose events
first come mid-run is shown then. A view that raises must not take the window with it: it is set aside until the
next run is shown, its dock says what failed, and everything else goes on.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Mapping
from typing import Any

from PySide6.QtWidgets import QStatusBar

from playground.events import RunFinished, RunStarted
from playground.state import Run
from playground.ui.views.base import View
from playground.ui.window_layout import ViewDock


class RunViews:
    """The selected run in ``views`` (each in its dock of ``docks``); failures are told on ``status``."""

    def __init__(self, views: Mapping[str, View], docks: Mapping[str, ViewDock], status: QStatusBar) -> None:
        self.views, self.docks, self.status = views, docks, status
        self.shown: set[str] = set()  # names of the views that show the selected run
        self.failures: dict[tuple[str, str], int] = {}  # (view, method) -> times it raised (logged once)
        self.kinds_seen = 0  # step event kinds the selected run had when its views were chosen
        self.failed: set[str] = set()  # views that raised on the shown run: their docks keep saying so

    def show(self, run: Run) -> None:
        """Every view that applies to ``run`` shows it; the others say why they are empty; the one that tells most
        comes to the front."""
        self.shown = set()
        self.failed = set()
        self.kinds_seen = len(run.step_kinds)
        for name, view in self.views.items():
            shown = view.applies_to(run)
            self.docks[name].show_view(shown, run)
            if shown:
                self.shown.add(name)
                self.call(name, "show_run", run)
            else:
                self.call(name, "reset")
        front = self.front_view(run)
        if front is not None:
            self.docks[front].raise_()  # bring it to the front when tabbed behind another

    def apply(self, run: Run, batch: list[Any]) -> None:
        """``batch``, just folded into the selected ``run``, in the views that show it (ended too, if the run did)."""
        for name in list(self.shown):
            if self.call(name, "apply", run, batch) and self.call(name, "flush") and run.finished is not None:
                self.call(name, "end", run)
        if any(isinstance(event, (RunStarted, RunFinished)) for event in batch):
            # The empty views' texts can say more now (a server's run: why they are empty; at its end, its figures).
            for name in self.views:
                if name not in self.shown and name not in self.failed:
                    self.docks[name].show_view(False, run)
        if len(run.step_kinds) != self.kinds_seen:  # a kind of step came that a view not shown yet draws
            self.kinds_seen = len(run.step_kinds)
            for name, view in self.views.items():
                if name not in self.shown and name not in self.failed and view.applies_to(run):
                    self.shown.add(name)
                    self.docks[name].show_view(True, run)
                    self.call(name, "show_run", run)

    def end(self, run: Run) -> None:
        """The selected ``run``'s job has ended: the views that show it draw its end."""
        for name in list(self.shown):
            self.call(name, "end", run)

    def shown_views(self) -> list[View]:
        return [self.views[name] for name in self.shown]

    def front_view(self, run: Run) -> str | None:
        """The view for what the run's strategy yields first (its most telling events), else the first that applies."""
        from playground.config.catalog import STRATEGIES

        asked = [name for name in self.views if name in self.shown and self.views[name].wants_front(run)]
        if asked:
            return asked[0]
        strategy = STRATEGIES.get(run.settings.strategy)
        kinds = strategy.step_events[:1] if strategy is not None else ()
        shown_in_order = [name for name in self.views if name in self.shown]  # the docks' order, not the set's
        for kind in kinds:
            for name in shown_in_order:
                if issubclass(kind, self.views[name].consumes):
                    return name
        return shown_in_order[0] if shown_in_order else None

    def call(self, name: str, method: str, *args: Any) -> bool:
        """View ``name``'s ``method`` (reset, show_run, apply, flush, end); True if it returned.

        A view that raises must not take the window with it (a run that never starts, a Generate that does
        nothing): its traceback goes to stderr (once per view and method), its dock says what failed, it is left
        out until the next run is shown, and everything else goes on."""
        try:
            getattr(self.views[name], method)(*args)
            return True
        except Exception as error:
            key = (name, method)
            self.failures[key] = self.failures.get(key, 0) + 1
            if self.failures[key] == 1:
                print(f"playground: the {name} view raised in {method}(); the window goes on without it:",
                      file=sys.stderr)
                traceback.print_exc(file=sys.stderr)
            self.shown.discard(name)
            self.failed.add(name)
            view = self.views[name]
            message = f"{type(error).__name__}: {error}".splitlines()[0]
            what = "clear itself" if method == "reset" else "draw this run"
            self.docks[name].show_failure(
                f"The {view.title.lower()} failed to {what} ({message}); the other views and the run go on. "
                "Details are in the terminal; select the run again to retry.")
            self.status.showMessage(f"The {view.title.lower()} failed to {what}: {message}", 10000)
            return False
