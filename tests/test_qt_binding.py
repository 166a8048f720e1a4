"""Guard against a Qt binding that leaks references to None/True: PySide6 6.12.0 on CPython 3.11 dropped one on
every void Qt call and every signal emit, and the app aborted (``none_dealloc``) after about a minute of streaming."""

from __future__ import annotations

import sys

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QLabel

CALLS = 20_000


class _Emitter(QObject):
    fired = Signal()


def test_void_calls_and_emits_keep_none_and_true_alive(qapp):
    label = QLabel()
    emitter = _Emitter()
    none_before, true_before = sys.getrefcount(None), sys.getrefcount(True)
    for _ in range(CALLS):
        label.setText("token")  # returns None
        emitter.fired.emit()  # returns True
    # A leaking binding would be CALLS below; small drift from other objects is fine.
    assert sys.getrefcount(None) > none_before - CALLS // 2
    assert sys.getrefcount(True) > true_before - CALLS // 2
