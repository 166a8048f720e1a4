"""The window's one background job at a time (a model load, a model fetch, a server check or a run): starting it,
taking its items, progress, failure and end, whether the window is busy, and what the buttons allow meanwhile.

A part of ``MainWindow``. A job's ``kind`` (``playground.ui.job_kinds.JobKind``) says whose its items are (a run's
events go to the window's runs, a model job's items to ``ModelChoice``), what its failure says and whether Stop may
end it; a job that takes its items itself says so when it starts (``take``: a salience job's maps go into the run
they explain), and so does a job something follows (``follower``: the steering dialog shows its build's progress,
failure and end; a run's failure goes into the session and its end to the views) or that leads to another
(``then``: a fetched model is loaded), so nothing here names those jobs. Closing the window lets a job that will
not end at once finish detached.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, cast

from PySide6.QtCore import QObject
from PySide6.QtWidgets import QPushButton

from playground.config import RunSettings
from playground.state import Branch, Run, Session
from playground.ui.banner import MessageBanner
from playground.ui.job_kinds import JobKind
from playground.ui.model_picker import ModelPicker
from playground.ui.runs_list import RunsList
from playground.ui.status_bar import RunStatusBar
from playground.ui.worker import GeneratorJob, JobBody

# Closing while a job runs: how long the window waits for the job to end before it closes anyway (the job then
# finishes in the background and the process exits without waiting for it, see ``app.launch``).
CLOSE_GRACE_MS = 150

ORPHAN_JOBS: list[GeneratorJob] = []  # jobs of closed windows, kept alive until their thread ends


def running_orphans() -> list[GeneratorJob]:
    return [job for job in ORPHAN_JOBS if job.is_running()]


class JobFollower(Protocol):
    """What follows a job besides the window (the "Build a steering vector" dialog follows its build, the run's
    follower its run)."""

    def show_progress(self, message: str, fraction: float) -> None: ...
    def show_error(self, message: str) -> None: ...
    def job_ended(self) -> None: ...  # done, failed or stopped


class BackgroundJobs:
    """The jobs part of ``MainWindow``: the attributes below are the window's (set in its ``__init__``); a run's
    items go to its ``_apply_events``, a model job's items to ``_take_model_items``."""

    job: GeneratorJob | None
    job_kind: JobKind | None  # None: no job
    session: Session
    picker: ModelPicker
    banner: MessageBanner
    status: RunStatusBar
    runs_list: RunsList
    generate_button: QPushButton
    stop_button: QPushButton
    _pending: list[tuple[RunSettings, Branch | None, Any]]  # a branch asked for while a run was live
    _then: Callable[[], None] | None = None  # what the job in hand leads to, once it has ended well
    # The job in hand's follower, held: a signal connected to a plain object's method holds it only weakly.
    _follower: JobFollower | None = None

    if TYPE_CHECKING:  # the window's (MainWindow) and ModelChoice's; declared for the type checker only
        @property
        def has_model(self) -> bool: ...
        def _take_model_items(self, batch: list[Any]) -> None: ...
        def _apply_events(self, batch: list[Any]) -> None: ...
        def start_run(self, settings: RunSettings, branch: Branch | None = None, plan: Any = None) -> Run: ...

    @property
    def busy(self) -> bool:
        return self.job is not None and self.job.is_running()

    def _start_job(self, body: JobBody, kind: JobKind, take: Callable[[list[Any]], None] | None = None,
                   follower: JobFollower | None = None, then: Callable[[], None] | None = None) -> None:
        """Start ``body`` as a job of ``kind``; ``take``: where its items go, for a job that takes them itself
        (otherwise its kind says: a model job's to ``ModelChoice``, the others' are a run's events); ``follower``:
        told of its progress, failure and end too (connected before it starts, so it misses nothing; it hears of
        the end while the window still holds the job); ``then``: called once the job has ended without an error
        and the window is free for the next (a fetch's model is loaded; a branch waiting for the job waits on)."""
        job = GeneratorJob(body, kind.value, cast(QObject, self))  # the window
        if follower is not None:  # first: it hears of the end before the window starts a pending run
            job.progress.connect(follower.show_progress)
            job.failed.connect(follower.show_error)
            job.finished.connect(follower.job_ended)
        job.items.connect(take if take is not None else self._on_items)
        job.progress.connect(self._on_progress)
        job.failed.connect(self._on_failed)
        job.finished.connect(self._on_finished)
        self.job, self.job_kind, self._then, self._follower = job, kind, then, follower
        self._update_buttons()
        job.start()

    def _on_items(self, batch: list[Any]) -> None:
        if self.job_kind is not None and self.job_kind.model_job:
            self._take_model_items(batch)
        else:
            self._apply_events(batch)

    def _on_progress(self, message: str, fraction: float) -> None:
        self.picker.show_progress(message, fraction)
        self.status.showMessage(message)

    def _on_failed(self, message: str) -> None:
        kind = self.job_kind
        if kind is not None and not kind.failure:  # the server dialog asked: it answers
            if self.picker.server_dialog is not None:
                self.picker.server_dialog.show_error(message)
            return
        what = kind.failure if kind is not None else "Failed"
        self.banner.show_error(f"{what}: {message}")
        self.status.showMessage(f"{what}: {message}", 10000)

    def _on_finished(self) -> None:
        job, then = self.job, self._then
        self.job, self.job_kind, self._then, self._follower = None, None, None, None
        if job is not None:
            job.deleteLater()
        self.picker.set_busy(False)
        self._update_buttons()
        if then is not None and job is not None and job.error is None:
            then()
        elif self._pending and self.has_model:
            settings, branch, plan = self._pending.pop()
            self.start_run(settings, branch, plan)

    def _update_buttons(self) -> None:
        busy = self.busy
        self.generate_button.setEnabled(not busy and self.has_model)
        kind = self.job_kind
        self.stop_button.setEnabled(busy and kind is not None and kind.stoppable)
        self.picker.set_busy(busy)
        if busy and kind is not None and kind.shows_progress:
            self.picker.progress.show()

    def _let_job_go(self) -> None:
        """The window closes: a run or fetch is told to stop; a job that does not end within a moment (a model load
        cannot be interrupted) is left to finish in the background, detached from the window."""
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
            self.job, self.job_kind, self._then, self._follower = None, None, None, None
