"""Run a generator (model load, model fetch, engine run) on a QThread and feed its items to the GUI in batches.

Why a ``QThread`` subclass and not a worker object moved to a thread: the thread object itself lives in the GUI
thread, so its ``finished`` signal is safe to wait on in tests and nothing needs a queued ``quit()`` (which
deadlocks against a blocking ``wait()``). Items go through a queue that a GUI timer drains ``FRAME_MS`` apart, so a
fast model costs one repaint per frame, not one per token.
"""

from __future__ import annotations

import queue
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from typing import Any

from PySide6.QtCore import QObject, QThread, QTimer, Signal

from playground.ui import gui_gc

StopCheck = Callable[[], bool]
Progress = Callable[[str, float], None]
# A job's body: gets a stop check and a progress callback, returns an iterator of items for the GUI.
JobBody = Callable[[StopCheck, Progress], Iterator[Any]]

# How often the GUI takes what the job yielded: 12.5 batches a second, so streamed tokens still appear smoothly.
# Each batch costs the GUI thread a few milliseconds (views, runs list, status bar, repaints) whatever its size, and
# on a 2-core CPU those are taken from the model: at 33 ms (~20 tokens/s, one token a batch) the window cost about
# 0.4 ms more GUI time per token than at 80 ms (benchmarks/bench_window.py measures the decode side by side).
FRAME_MS = 80
# After Stop, how many more items a job that polls ``should_stop`` may yield (the step in flight, the final
# event) before the worker closes it anyway.
STOP_GRACE_ITEMS = 3


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


class _GeneratorThread(QThread):
    def __init__(self, body: JobBody, inbox: queue.SimpleQueue, stop_flag: threading.Event) -> None:
        super().__init__()
        self._body = body
        self._inbox = inbox
        self._stop_flag = stop_flag

    def should_stop(self) -> bool:
        return self._stop_flag.is_set() or self.isInterruptionRequested()

    def _progress(self, message: str, fraction: float) -> None:
        self._inbox.put(("progress", (message, fraction)))

    def run(self) -> None:  # runs in the worker thread
        items: Iterator[Any] | None = None
        try:
            items = iter(self._body(self.should_stop, self._progress))
            grace = STOP_GRACE_ITEMS
            for item in items:
                self._inbox.put(("item", item))
                if self.should_stop():
                    grace -= 1
                    if grace <= 0:
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

    @property
    def thread(self) -> QThread:
        return self._thread

    def start(self) -> None:
        gui_gc.job_started()  # while it runs, the worker must never run the collector (see gui_gc)
        self._counted = True
        self._timer.start()
        self._thread.start()

    def stop(self) -> None:
        """Ask the job to end: the engine sees it before its next step; other jobs between items."""
        self._stop_flag.set()
        self._thread.requestInterruption()

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
        if self._counted:
            self._counted = False
            gui_gc.job_ended()
        self._timer.stop()
        self._drain()
        if self.error is not None:
            self.failed.emit(self.error)
        self.finished.emit()
