"""Python's cyclic garbage collector runs only on the GUI thread once a background job has started.

Why: the collector runs in whichever thread happens to allocate when a threshold is crossed. When that is a worker
thread (a model load, a conversion, a decode) and the garbage holds Qt widgets (a closed window's menus), the worker
destroys them: Qt's ``QObject`` destructor takes Qt's internal mutex and then asks for the GIL (PySide's override
lookup), while the GUI thread, holding the GIL, waits for that same mutex to delete its own objects. Both wait for
ever. We saw exactly this under gdb (a worker in ``gc_alloc`` → ``QMenu::~QMenu`` → ``PyGILState_Ensure``; the GUI
thread in ``QObject::~QObject`` → ``QBasicMutex::lockInternal``). pyqtgraph's ``GarbageCollector`` is the known cure:
automatic collection off, and the same generational thresholds checked on a GUI timer.
"""

from __future__ import annotations

import gc

from PySide6.QtCore import QCoreApplication

_collector = None  # the one collector of this process (its QTimer lives in the GUI thread)


def collect_on_gui_thread() -> None:
    """Turn automatic collection off and collect from a GUI-thread timer instead (idempotent).

    Must be called on the GUI thread, before a job starts Python work on another thread.
    """
    global _collector
    if _collector is not None or QCoreApplication.instance() is None:
        return
    from pyqtgraph.util.garbage_collector import GarbageCollector

    _collector = GarbageCollector(interval=0.5)


def collect_now() -> None:
    """Collect what the thresholds call for, here and now (on the GUI thread): for loops that spin no events."""
    if _collector is not None:
        _collector.check()


def gui_thread_collects() -> bool:
    return _collector is not None and not gc.isenabled()
