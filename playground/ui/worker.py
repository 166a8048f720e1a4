"""Run a generator (model load, model fetch, engine run) on a QThread and feed its items to the GUI in batches.

Why a ``QThread`` subclass and not a worker object moved to a thread: the thread object itself lives in the GUI
thread, so its ``finished`` signal is safe to wait on in tests and nothing needs a queued ``quit()`` (which
deadlocks against a blocking ``wait()``). Items go through a queue that a GUI timer drains ``FRAME_MS`` apart, so a
fast model costs one repaint per frame, not one per token.
"""

from __future__ import annotations

import atexit
import os
import queue
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

from PySide6.QtCore import QObject, QThread, QTimer, Signal

from playground.config.catalog import Progress, StopCheck
from playground.ui import gui_gc, switch_interval

# A job's body: gets a stop check and a progress callback, returns an iterator of items for the GUI.
JobBody = Callable[[StopCheck, Progress], Iterator[Any]]

# How often the GUI takes what the job yielded: 10 batches a second, so streamed tokens still appear smoothly.
# Each batch costs the GUI thread a few milliseconds (views, runs list, status bar, repaints) whatever its size, and
# on a 2-core CPU those are taken from the model: at 33 ms (~20 tokens/s, one token a batch) the window cost about
# 0.4 ms more GUI time per token than at 80 ms, and at 80 ms (the default model at ~15 tokens/s: most batches one
# token) the GUI thread took 9.7 % of a core against 6.4 % at 100 ms (benchmarks/bench_window.py, 300 tokens).
FRAME_MS = 100
# After Stop the job runs to its own end: an engine strategy polls ``should_stop`` before each step and ends with its
# final event (the figures so far), however many events the step in flight still yields (a speculative round, two
# panes side by side). A job still yielding this long after Stop ignores it: the worker then closes it (a safety
# net for a broken job, not a budget for a working one, which ends within one step).
STOP_DEADLINE_S = 10.0
# At the interpreter's exit, how long to wait for jobs still running (a model load cannot be interrupted; a stopped
# run ends within a step) before leaving without them.
EXIT_WAIT_S = 60.0


def describe_error(error: BaseException) -> str:
    """A message for the user: our own errors already say what to do; others get their type."""
    from playground.errors import USER_ERRORS

    if isinstance(error, (*USER_ERRORS, ValueError, FileNotFoundError, PermissionError)):
        return str(error) or type(error).__name__
    if isinstance(error, MemoryError):
        return "out of memory: try a smaller model, fewer tokens or a smaller dtype"
    return f"{type(error).__name__}: {error}"


def is_user_error(error: BaseException) -> bool:
    """One of the project's errors whose message is meant for the user (``playground.errors.USER_ERRORS``)."""
    from playground.errors import USER_ERRORS

    return isinstance(error, USER_ERRORS)


# Every started job thread until it has ended and been waited for: Python must never free the wrapper of a running
# QThread (Qt then aborts the process: "QThread: Destroyed while thread '' is still running"), whatever happened to
# the job or window that started it.
_LIVE_THREADS: set[_GeneratorThread] = set()


def live_threads() -> list[_GeneratorThread]:
    """Job threads that have not ended yet."""
    return [thread for thread in _LIVE_THREADS if not thread.isFinished()]


def wait_for_jobs(timeout_s: float) -> bool:
    """Ask every job still running to stop and wait for their threads, at most ``timeout_s`` in all; True if none
    is left running."""
    deadline = time.monotonic() + timeout_s
    for thread in live_threads():
        thread.request_stop()
        thread.wait(max(0, int((deadline - time.monotonic()) * 1000)))
    return not live_threads()


@atexit.register
def _end_jobs_at_exit() -> None:
    """Before Python's shutdown frees the module globals (and with them a still running job's thread), let the jobs
    end; one that will not (within ``EXIT_WAIT_S``) is left behind by leaving the process now, which is an exit,
    not Qt's abort."""
    if wait_for_jobs(EXIT_WAIT_S):
        return
    print(f"playground: a background job did not end within {EXIT_WAIT_S:g} s of exit; leaving without it",
          file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


class _GeneratorThread(QThread):
    def __init__(self, body: JobBody, inbox: queue.SimpleQueue, stop_flag: threading.Event) -> None:
        super().__init__()
        self._body = body
        self._inbox = inbox
        self._stop_flag = stop_flag
        self.stop_requested_at: float | None = None  # time.monotonic() of the first Stop (set by the GUI thread)

    def should_stop(self) -> bool:
        return self._stop_flag.is_set() or self.isInterruptionRequested()

    def request_stop(self) -> None:
        """Any thread may call it."""
        if self.stop_requested_at is None:
            self.stop_requested_at = time.monotonic()
        self._stop_flag.set()
        self.requestInterruption()

    def _past_stop_deadline(self) -> bool:
        if self.stop_requested_at is None:  # interrupted from elsewhere (requestInterruption): start the clock now
            self.stop_requested_at = time.monotonic()
        return time.monotonic() - self.stop_requested_at > STOP_DEADLINE_S

    def _progress(self, message: str, fraction: float) -> None:
        self._inbox.put(("progress", (message, fraction)))

    def run(self) -> None:  # runs in the worker thread
        items: Iterator[Any] | None = None
        try:
            items = iter(self._body(self.should_stop, self._progress))
            for item in items:
                self._inbox.put(("item", item))
                if self.should_stop() and self._past_stop_deadline():
                    self._inbox.put(("error", f"it did not end within {STOP_DEADLINE_S:g} s of Stop, so it was "
                                              "closed before its final event (a job should end within one step)"))
                    break
        except Exception as error:  # any failure becomes a message; the app stays usable
            if not is_user_error(error):  # ours say what to do; others need a trace
                traceback.print_exc(file=sys.stderr)
            self._inbox.put(("error", describe_error(error)))
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                try:
                    close()
                except Exception:  # a generator that fails while closing has nothing more to say
                    traceback.print_exc(file=sys.stderr)


class GeneratorJob(QObject):
    """One background job. Lives in the GUI thread; every signal is emitted in the GUI thread.

    ``items`` carries batches (lists) in order, ``progress`` the latest progress report, ``failed`` a message;
    ``finished`` comes once, after the last batch and any failure, whatever happened.
    """

    items = Signal(list)
    progress = Signal(str, float)
    failed = Signal(str)
    finished = Signal()

    def __init__(self, body: JobBody, name: str = "job", parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.name = name
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._stop_flag = threading.Event()
        self._thread = _GeneratorThread(body, self._inbox, self._stop_flag)
        self._thread.finished.connect(self._on_thread_finished)
        self._timer = QTimer(self)
        self._timer.setInterval(FRAME_MS)
        self._timer.timeout.connect(self._drain)
        self._done = False
        self._counted = False  # counted among the running jobs of gui_gc
        self.error: str | None = None

    @property  # the job's own thread; hides QObject.thread() (the thread this object lives in: the GUI's)
    def thread(self) -> QThread:  # type: ignore[override]
        return self._thread

    def start(self) -> None:
        gui_gc.job_started()  # while it runs, the worker must never run the collector (see gui_gc)
        switch_interval.job_started()  # and the GIL changes hands in short turns (see switch_interval)
        self._counted = True
        self._timer.start()
        _LIVE_THREADS.add(self._thread)
        self._thread.start()

    def stop(self) -> None:
        """Ask the job to end: the engine sees it before its next step and ends with its final event; a job that
        goes on yielding for ``STOP_DEADLINE_S`` after this is closed."""
        self._thread.request_stop()

    @property
    def stopping(self) -> bool:
        return self._stop_flag.is_set()

    def is_running(self) -> bool:
        return not self._done

    def wait(self, ms: int) -> bool:
        """Block until the thread ends (at most ``ms``), then deliver what is left. True if it ended."""
        ended = self._thread.wait(ms)
        if ended:
            self._on_thread_finished()
        return ended

    def drain(self) -> None:
        """Deliver what the job has yielded so far now (before the next frame)."""
        self._drain()

    def _drain(self) -> None:
        batch: list[Any] = []
        while True:
            try:
                kind, payload = self._inbox.get_nowait()
            except queue.Empty:
                break
            if kind == "item":
                batch.append(payload)
            elif kind == "progress":
                if batch:
                    self.items.emit(batch)
                    batch = []
                self.progress.emit(*payload)
            elif kind == "error":
                self.error = payload
        if batch:
            self.items.emit(batch)

    def _on_thread_finished(self) -> None:
        if self._done:
            return
        self._done = True
        # `finished` was emitted as the thread's last act; wait for it to really exit before anyone frees it.
        self._thread.wait()
        _LIVE_THREADS.discard(self._thread)
        if self._counted:
            self._counted = False
            gui_gc.job_ended()
            switch_interval.job_ended()
        self._timer.stop()
        self._drain()
        if self.error is not None:
            self.failed.emit(self.error)
        self.finished.emit()


class StepChooser(QObject):
    """Step mode ("you are the sampler"): the engine's ``chooser`` for one run, called on the worker thread before
    each token is committed. While ``active`` it hands the step to the GUI (``asked``, delivered on the GUI thread)
    and blocks until the GUI ``answer``s with a token, or None to end the run; Stop (the job's stop check, polled
    every ``POLL_S``) ends the wait with None, so the run ends "stopped" with its final event. Not active (Run on):
    the strategy's own choice, at once."""

    asked = Signal(object)  # the step as it would be recorded with the strategy's own choice (a TokenStep)
    POLL_S = 0.05

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._answers: queue.SimpleQueue = queue.SimpleQueue()
        self._active = threading.Event()
        self._active.set()
        self.should_stop: StopCheck = lambda: False  # the job's, set by the job's body before the run starts
        self.waiting = False  # a step is waiting for the GUI's answer

    @property
    def active(self) -> bool:
        return self._active.is_set()

    def set_active(self, active: bool) -> None:
        """Any thread. Off: the run goes on by itself (a step waiting now is answered by the GUI's Run on)."""
        if active:
            self._active.set()
        else:
            self._active.clear()

    def answer(self, token_id: int | None) -> None:
        """The GUI's answer to the waiting step: the token to take, or None to stop the run."""
        self._answers.put(token_id)

    def __call__(self, step: Any) -> int | None:  # runs on the worker thread
        if not self._active.is_set():
            return step.token_id
        while True:  # an answer left over from a step that Stop ended is never taken for a new one
            try:
                self._answers.get_nowait()
            except queue.Empty:
                break
        self.waiting = True
        self.asked.emit(step)
        try:
            while True:
                if self.should_stop():
                    return None
                try:
                    return self._answers.get(timeout=self.POLL_S)
                except queue.Empty:
                    continue
        finally:
            self.waiting = False
