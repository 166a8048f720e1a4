"""While a background job runs, Python's cyclic garbage collector runs only on the GUI thread.

Why: the collector runs in whichever thread happens to allocate when a threshold is crossed. When that is a worker
thread (a model load, a conversion, a decode) and the garbage holds Qt widgets (a closed window's menus), the worker
destroys them: Qt's ``QObject`` destructor takes Qt's internal mutex and then asks for the GIL (PySide's override
lookup), while the GUI thread, holding the GIL, waits for that same mutex to delete its own objects. Both wait for
ever. We saw exactly this under gdb (a worker in ``gc_alloc`` → ``QMenu::~QMenu`` → ``PyGILState_Ensure``; the GUI
thread in ``QObject::~QObject`` → ``QBasicMutex::lockInternal``).

The cure is pyqtgraph's (``pyqtgraph.util.garbage_collector``): automatic collection off, and the same generational
thresholds checked on a GUI timer. Unlike pyqtgraph we do it only while a job runs: between jobs the collector works
as Python's usual one, at the moments Qt code has always seen it run (collecting widgets only from a timer, inside
whatever the event loop is doing, broke pyqtgraph items mid-layout in our tests).

While a job runs, what was alive when it started is frozen (``gc.freeze``: left out of every scan until the last job
ends and ``gc.unfreeze`` hands it back to the oldest generation). The collector's own rule runs a full collection
only when the oldest generation has grown by a quarter; this check cannot see that count and collects it whenever
its threshold is crossed, so without the freeze each of those scanned every object of torch, transformers and the
window (~30 ms of the GUI thread, several times a run, taken from the model on a 2-core CPU). Cycles among the
frozen objects are collected after the job, as they would be by a full collection. Where something else froze
objects already (the test suite's conftest), that is left as it is.
"""

from __future__ import annotations

import gc

from PySide6.QtCore import QObject, QTimer

CHECK_MS = 500


class _GuiThreadCollector(QObject):
    def __init__(self) -> None:
        super().__init__()
        self.jobs = 0
        self.froze = False  # this collector froze the objects alive at the first job's start
        self.timer = QTimer(self)
        self.timer.setInterval(CHECK_MS)
        self.timer.timeout.connect(self.check)

    def check(self) -> None:
        """Collect the generations whose thresholds were crossed, as the automatic collector would."""
        t0, t1, t2 = gc.get_threshold()
        c0, c1, c2 = gc.get_count()
        if c0 > t0:
            gc.collect(2 if c1 > t1 and c2 > t2 else 1 if c1 > t1 else 0)


_collector: _GuiThreadCollector | None = None


def job_started() -> None:
    """A job is about to run Python on another thread (call on the GUI thread): collect only here from now on."""
    global _collector
    if _collector is None:
        _collector = _GuiThreadCollector()
    _collector.jobs += 1
    if _collector.jobs == 1:
        gc.disable()
        _collector.froze = gc.get_freeze_count() == 0
        if _collector.froze:
            gc.freeze()
        _collector.timer.start()


def job_ended() -> None:
    """A job's thread has ended (call on the GUI thread): with none left, the usual collector is back."""
    if _collector is None or _collector.jobs == 0:
        return
    _collector.jobs -= 1
    if _collector.jobs == 0:
        _collector.timer.stop()
        if _collector.froze:
            _collector.froze = False
            gc.unfreeze()
        gc.enable()


def collect_now() -> None:
    """While jobs run: collect what the thresholds call for, here and now (loops that spin no events)."""
    if _collector is not None and _collector.jobs:
        _collector.check()


def gui_thread_collects() -> bool:
    return _collector is not None and _collector.jobs > 0 and not gc.isenabled()
