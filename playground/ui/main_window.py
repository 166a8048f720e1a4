"""The main window: the prompt on top, every registered view in a dock, settings on the left, runs below.

Data flows one way: a background job yields engine events → ``Session`` folds them → views draw. At most one job
(model load, model fetch, a server check or a run) is active at a time. The window knows views only through the
view interface (``playground.ui.views.base.View``) and the registry; it never names a strategy or a view.

The model is a ``ModelSource`` (``playground.ui.model_sources``): one loaded here or one on a server, behind one
interface (labels, check, run, branch); a run streams from either in the same job, with the same events, Stop and
close, and the window never asks which kind it holds.

This module holds the window's widgets, its runs (generate, branch, select, their events) and closing; the rest is
by concern: ``window_layout`` (the docks and where they sit), ``window_state`` (what is kept between sessions),
``window_menus`` and ``presets_menu``, ``saved_runs`` (runs and views to files), ``run_views`` (which views show
the selected run), ``model_choice`` (loading, fetching, connecting a server) and ``background_jobs`` (the one job).
"""

from __future__ import annotations

import html
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from PySide6.QtCore import QSettings, Signal
from PySide6.QtGui import QAction, QCloseEvent, QKeySequence, QShortcut
from PySide6.QtWidgets import QCheckBox, QDockWidget, QMainWindow, QPlainTextEdit, QPushButton

from playground.config import ConfigError, ModelSettings, RunSettings
from playground.config.plugins import load_capabilities
from playground.config.steering import LiveStrength, SteeringSettings
from playground.events import PrefillProgress
from playground.state import Branch, Run, Session
from playground.ui import window_layout, window_state
from playground.ui.attribution_job import AttributionJobs
from playground.ui.background_jobs import BackgroundJobs, running_orphans
from playground.ui.banner import MessageBanner
from playground.ui.controls import RunControls
from playground.ui.job_kinds import JobKind
from playground.ui.model_choice import ModelChoice
from playground.ui.model_picker import ModelPicker
from playground.ui.model_sources import ModelSource
from playground.ui.presenting import Presenter
from playground.ui.presets_menu import add_presets_menu, show_preset
from playground.ui.run_views import RunViews
from playground.ui.runs_list import RunsList
from playground.ui.salience_job import SalienceJobs
from playground.ui.saved_runs import SavedRuns
from playground.ui.status_bar import RunStatusBar
from playground.ui.style import configure_pyqtgraph
from playground.ui.views.base import View
from playground.ui.window_layout import ViewDock
from playground.ui.window_menus import add_file_menu, add_tools_menu, add_view_menu
from playground.ui.worker import GeneratorJob, StepChooser

if TYPE_CHECKING:
    from playground.ui.steer_build_dialog import SteerBuildDialog

__all__ = ["MainWindow", "ViewDock", "running_orphans"]


class _RunFollower:
    """What a run's job means besides its events: a failure is the running run's (the session marks it failed),
    and its end, however it came, is drawn by the run's views (``MainWindow._run_ended``)."""

    def __init__(self, window: MainWindow) -> None:
        self.window = window

    def show_progress(self, message: str, fraction: float) -> None:
        """The window's status bar shows it already."""

    def show_error(self, message: str) -> None:
        run = self.window.session.fail(message)
        if run is not None:
            self.window.runs_list.update_run(run)

    def job_ended(self) -> None:
        self.window._run_ended(self.window.job)


class MainWindow(ModelChoice, BackgroundJobs, AttributionJobs, SalienceJobs, QMainWindow):
    closed = Signal()  # the window really closed

    def __init__(self, model_settings: ModelSettings | None = None, run_settings: RunSettings | None = None,
                 store: QSettings | None = None) -> None:
        super().__init__()
        configure_pyqtgraph()
        self.setWindowTitle("Decoding Playground")
        self.store = store or QSettings("decoding-playground", "playground")
        run_settings = run_settings or window_state.last_run_settings(self.store) or RunSettings()
        self.model_spec = model_settings or ModelSettings()
        self.session = Session()
        self.source: ModelSource | None = None  # a model loaded here, or one on a server
        self.job: GeneratorJob | None = None
        self.job_kind: JobKind | None = None
        # A branch asked for while a run was live: settings, the branch, and what the source needs to continue it.
        self._pending: list[tuple[RunSettings, Branch | None, Any]] = []
        self._running_run: Run | None = None  # the run the current job decodes
        self._salience_run: Run | None = None  # the run a salience job explains
        self.steer_build_dialog: SteerBuildDialog | None = None  # made when first opened

        # --- widgets ------------------------------------------------------------------------------------
        self.picker = ModelPicker(self.store, self.model_spec)
        load_capabilities()  # capabilities from outside the package: their strategies, settings and views
        self.controls = RunControls(run_settings)
        self.prompt = QPlainTextEdit(run_settings.prompt)
        self.prompt.setPlaceholderText("Write a prompt, then Generate (Ctrl+Enter)")
        self.prompt.setMaximumHeight(64)
        self.generate_button = QPushButton("Generate")
        self.generate_button.setToolTip("Start a run with these settings (Ctrl+Enter)")
        self.generate_button.setDefault(True)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setToolTip("End the run before its next token (or the prompt's next chunk)")
        self.step_mode = QCheckBox("Step mode")
        self.step_mode.setToolTip("You are the sampler: the run (greedy or sample, on a model loaded here) waits "
                                  "before each token for you to pick one in the tokens view (↑/↓, Enter; Space "
                                  "takes the sampler's; Esc stops); Run on lets it go on by itself")
        self.step_chooser: StepChooser | None = None  # the running run's, in step mode
        self.live_strength: LiveStrength | None = None  # the running steered run's (the steering view's slider)
        self.banner = MessageBanner()
        self.runs_list = RunsList()
        self.status = RunStatusBar()
        self.setStatusBar(self.status)
        self.views, self.docks = window_layout.view_docks(self)
        for view in self.views.values():
            view.branch_requested.connect(self.branch)
            view.why_requested.connect(self.explain_alternative)
            if view.picks_tokens:  # a view that lets the user pick a waiting step's token
                picker = cast(Any, view)  # it has the signals the flag promises (views.base.View.picks_tokens)
                picker.choice_made.connect(self._answer_choice)
                picker.run_on_requested.connect(self._run_on)
            if view.sets_strength:  # a strength slider (the steering view): the running run's live strength
                cast(Any, view).strength_requested.connect(self._steer_live)
            if view.attributes:  # an Attribute button (the "why this token" view): ui/attribution_job.py
                cast(Any, view).attribution_requested.connect(self.attribute_step)
            if view.explains_steps:  # "Explain step N" (the salience view): a salience job on the shown run
                cast(Any, view).salience_requested.connect(self.explain_step)
        self.run_views = RunViews(self.views, self.docks, self.status)
        self.view_failures = self.run_views.failures  # (view, method) -> times it raised (logged once)
        self.saved_runs = SavedRuns(self, self.session, self.views, self.banner, self.status, self._list_and_show)

        self._build_layout()
        self._build_menus()

        # --- wiring -------------------------------------------------------------------------------------
        self.generate_button.clicked.connect(self.generate)
        self.stop_button.clicked.connect(self.stop)
        self.step_mode.toggled.connect(self._step_mode_toggled)
        QShortcut(QKeySequence("Ctrl+Return"), self, self.generate)  # calls it when activated
        self.controls.steer_field().build_requested.connect(self.open_steer_build)
        self.picker.load_requested.connect(self.load_model)
        self.picker.fetch_requested.connect(self.fetch_default_model)
        self.picker.server_requested.connect(self.connect_server)
        self.picker.server_test_requested.connect(self.test_server)
        self.runs_list.run_selected.connect(self.select_run)
        self._update_buttons()

    # --- layout (playground.ui.window_layout, window_state) -----------------------------------------------
    def _build_layout(self) -> None:
        centre = window_layout.prompt_area(self.banner, self.prompt, self.generate_button, self.stop_button,
                                           self.step_mode)
        window_layout.prepare_docking(self, centre)
        self.settings_dock = window_layout.titled_dock(self, "Settings", "settings",
                                                       window_layout.settings_panel(self.picker, self.controls))
        self.runs_dock = window_layout.titled_dock(self, "Runs", "runs", window_layout.runs_panel(self.runs_list))
        window_layout.arrange_default(self, self.settings_dock, list(self.docks.values()), self.runs_dock)
        self._default_state = window_state.dock_state(self)
        window_state.restore_window_state(self, self.store)

    def views_side_by_side(self) -> None:
        """Every open view dock next to the others, left to right, sharing the width."""
        window_layout.arrange_side_by_side(self, list(self.docks.values()))

    def reset_layout(self) -> None:
        window_state.restore_dock_state(self, self._default_state)

    def _build_menus(self) -> None:
        self.open_action, self.save_action = add_file_menu(
            self.menuBar(), self.views.values(), self.open_run_dialog, self.save_run_dialog,
            lambda view: self.export_view_dialog(view), self.close, self.export_animation_dialog,
            self.export_web_page_dialog)
        add_presets_menu(self.menuBar(), lambda name: self.apply_preset(name, run=True), self.banner)
        docks: list[QDockWidget] = [*self.docks.values(), self.settings_dock, self.runs_dock]
        self.presenter = Presenter(self)
        self.reset_layout_action: QAction = add_view_menu(self.menuBar(), docks, self.views_side_by_side,
                                                          self.reset_layout, self.presenter.toggle)
        self.tune_lens_action, self.steer_build_action = add_tools_menu(  # after View: menus keep places
            self.menuBar(), self.train_tuned_lens, self.open_steer_build)

    # --- the settings form and presets (playground.ui.presets_menu) ---------------------------------------
    def current_settings(self) -> RunSettings:
        return self.controls.run_settings(self.prompt.toPlainText())

    def set_run_settings(self, settings: RunSettings) -> None:
        self.prompt.setPlainText(settings.prompt)
        self.controls.set_run_settings(settings)

    def apply_preset(self, name: str, run: bool = False) -> None:
        """Put a preset's prompt and settings in the form, show its view, and (``run``) generate."""
        if show_preset(name, self.set_run_settings, self.docks, self.banner, self.status,
                       self.lm.own_name if self.lm else None, self.load_bundled) \
                and run and self.has_model and not self.busy:
            self.generate()

    # --- runs ---------------------------------------------------------------------------------------------
    def generate(self) -> None:
        if self.busy:
            return
        if not self.has_model:
            self.banner.show_error("No model is loaded yet: load one on the left (or wait for it to load), or use "
                                   "a model on a server (Server…).")
            return
        settings = self.current_settings()
        assert self.source is not None  # has_model
        try:
            self.source.check(settings)
        except ConfigError as error:  # a message over lines (a constraint's, with its caret) keeps its layout
            message = str(error)
            self.banner.show_error(message if "\n" not in message else
                                   f"<pre style='margin:0'>{html.escape(message)}</pre>")
            return
        self.start_run(settings)

    def start_run(self, settings: RunSettings, branch: Branch | None = None, plan: Any = None) -> Run:
        """Start a run of the current source; ``plan``: what the source's ``branch`` returned for a branch."""
        source = self.source
        assert source is not None
        self.banner.hide()
        run = self.session.start_run(settings, branch)
        self._running_run = run
        self._list_and_show(run)
        chooser = None
        if self.step_mode.isChecked():
            if source.takes_chooser(settings):
                chooser = StepChooser(self)
                chooser.asked.connect(self._choice_asked)
            else:
                self.banner.show_info(f"Step mode picks tokens of greedy and sample runs on a model loaded here: "
                                      f"this {settings.strategy} run goes on by itself.")
        self.step_chooser = chooser
        live = self.live_strength = LiveStrength() if settings.group(SteeringSettings).active() else None

        def body(should_stop, progress) -> Iterator[Any]:
            if chooser is None:
                return source.run(settings, should_stop, progress, plan, steering=live)
            chooser.should_stop = should_stop
            return source.run(settings, should_stop, progress, plan, chooser=chooser, steering=live)

        self.status.showMessage("Generating…")
        self._start_job(body, JobKind.RUN, follower=_RunFollower(self))
        return run

    def stop(self) -> None:
        if self.job is not None:
            self.job.stop()
            self.status.showMessage("Stopping…")

    # --- step mode ("you are the sampler") -----------------------------------------------------------------
    def _choice_asked(self, step: Any) -> None:
        """The running run waits for the user's pick: its events so far are drawn, then the picking view asks."""
        if self.job is not None:
            self.job.drain()
        if self.step_chooser is None or self.sender() is not self.step_chooser:
            return  # a run that has ended since
        for view in self.shown_views():
            if view.picks_tokens:
                cast(Any, view).ask_choice(step)
                self.status.showMessage(f"Step {step.step}: your pick (Enter), the sampler's (Space) or Esc")
                return

    def _answer_choice(self, token_id: Any) -> None:
        if self.step_chooser is not None:
            self.step_chooser.answer(token_id)

    def _run_on(self) -> None:
        """The run goes on by itself (the waiting step takes the sampler's choice)."""
        self.step_mode.setChecked(False)

    def _step_mode_toggled(self, on: bool) -> None:
        if self.step_chooser is not None:
            self.step_chooser.set_active(on)

    def _steer_live(self, strength: float) -> None:
        """The steering view's slider moved: the running run's next token uses ``strength`` (every vector's)."""
        if self.live_strength is not None:
            self.live_strength.set(strength)

    def explain_alternative(self, step: int, against: int) -> None:
        """A view asked why the selected run chose its token at ``step`` and not ``against``: the view that explains
        it (the "why this token" view) shows it, and comes to the front."""
        for name, view in self.views.items():
            if view.explain_alternative(step, against):
                self.docks[name].show()
                self.docks[name].raise_()
                return
        self.banner.show_info("No view here explains a step's token against another.")

    def branch(self, step: int, token_id: int) -> None:
        """Continue the selected run from ``step`` with ``token_id`` instead of what it chose."""
        run = self.session.selected
        if run is None:
            return
        if self.source is None:
            self.banner.show_error("Load a model to branch: a saved run replays without one, but continuing it "
                                   "needs the model")
            return
        if self.busy and self.job_kind is not JobKind.RUN:
            self.banner.show_info("Wait for the current job to finish (a model load or a server check), then "
                                  "branch.")
            return
        try:
            made = self.source.branch(self.session, run, step, token_id)
        except ConfigError as error:
            self.banner.show_error(str(error))
            return
        if made is not None:
            self._start_branch(*made)

    def _start_branch(self, settings: RunSettings, branch: Branch, plan: Any) -> None:
        if self.busy:
            # Stop what is running; the branch starts as soon as the job has ended.
            self._pending = [(settings, branch, plan)]
            self.stop()
            return
        self.start_run(settings, branch, plan)

    def select_run(self, index: int) -> None:
        run = self.session.select(index)
        self.runs_list.mark_selected(index)
        self._show_selected(run)
        self.status.show_run(run)

    def _list_and_show(self, run: Run) -> None:
        """A new run (started, branched or opened): in the runs list, selected, and in its views."""
        self.runs_list.update_run(run)
        self.runs_list.mark_selected(run.index)
        self._show_selected(run)

    def _show_selected(self, run: Run) -> None:
        """Every view that applies to ``run`` shows it; the others say why they are empty."""
        self.run_views.show(run)
        self.status.show_run(run)

    def shown_views(self) -> list[View]:
        """The views that show the selected run."""
        return self.run_views.shown_views()

    def _apply_events(self, batch: list[Any]) -> None:
        """A run job's events: folded into the session, then drawn if their run is the selected one."""
        run: Run | None = None
        for event in batch:
            run = self.session.apply(event) or run
            if isinstance(event, PrefillProgress):
                self.status.showMessage(f"Reading the prompt: {event.done_tokens} of {event.total_tokens} "
                                        "tokens…")
        if run is None:
            return
        self.runs_list.update_run(run)
        if run is not self.session.selected:
            return
        self.run_views.apply(run, batch)
        self.status.show_run(run)

    def _run_ended(self, job: GeneratorJob | None) -> None:
        """The run job has ended (finished, stopped or failed): its run's views draw its end."""
        ended, self._running_run = self._running_run, None
        self.step_chooser = None
        self.live_strength = None
        self.session.end_live()
        if ended is not None:
            self.runs_list.update_run(ended)
            if ended is self.session.selected:
                self.run_views.end(ended)
                self.status.show_run(ended)
        if ended is not None and ended.finished is not None and job is not None and job.error is None:
            cut = ended.finished.cut_short
            note = f" (Stop cut short: {', '.join(c.replace('_', ' ') for c in cut)})" if cut else ""
            if ended.finished.stop_note:  # why it ended, where the reason needs words (a constraint, a ban, a reply)
                note += f": {ended.finished.stop_note}"
            self.status.showMessage(f"Run #{ended.index + 1} done: {ended.finished.stop_reason}, "
                                    f"{ended.count_label()}{note}", 10000)

    # --- saved runs and exports (playground.ui.saved_runs) ------------------------------------------------
    def open_run(self, path: str | Path) -> Run | None:
        """Show a saved run (``trace`` output) in every view that applies, without any model."""
        return self.saved_runs.open(path)

    def save_run(self, path: str | Path) -> Path:
        return self.saved_runs.save(path)

    def open_run_dialog(self) -> None:
        self.saved_runs.open_dialog()

    def save_run_dialog(self) -> None:
        self.saved_runs.save_dialog()

    def export_view_dialog(self, view: View) -> None:
        self.saved_runs.export_dialog(view)

    def export_view(self, name: str, path: str | Path) -> Path | None:
        return self.saved_runs.export(name, path)

    def export_animation_dialog(self, view: str | None) -> None:
        from playground.ui.animation_dialog import export_animation_dialog

        export_animation_dialog(self, view)

    def export_web_page_dialog(self) -> None:
        self.saved_runs.export_page_dialog()

    # --- closing ------------------------------------------------------------------------------------------
    def closeEvent(self, event: QCloseEvent) -> None:
        """Close now, whatever runs: a run or fetch is told to stop; a job that does not end within a moment
        (a model load cannot be interrupted) is left to finish in the background, detached from the window."""
        window_state.save_window_state(self, self.store, self.current_settings())
        self._let_job_go()
        super().closeEvent(event)
        self.closed.emit()
