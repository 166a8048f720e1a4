"""While a background job runs, Python hands the GIL between threads every 0.5 ms instead of every 5 ms.

Why: the decode thread runs Python between its torch calls (the loop, the samplers, packing each step's event), and
for that it needs the GIL. When the GUI thread holds it (folding events, laying out text and charts), the decode
thread waits until the GUI thread lets go or the switch interval runs out, and with it the model's other torch
thread waits at its next barrier: on a 2-core CPU the window cost the decode about twice the GUI thread's own CPU
share. With a 0.5 ms interval the GUI thread's work is cut into short turns; bench_window.py (300 tokens, 3 pairs,
SmolLM2 on 2 cores) gave 0.92x a plain thread at 5 ms, 0.96x at 0.5 ms, with the GUI thread's share unchanged
(5.4-5.5 % of each decode second). Between jobs Python's own interval is back.
"""

from __future__ import annotations

import sys

JOB_INTERVAL_S = 0.0005

_jobs = 0
_before = sys.getswitchinterval()


def job_started() -> None:
    """A job is about to run Python on another thread (call on the GUI thread)."""
    global _jobs, _before
    _jobs += 1
    if _jobs == 1:
        _before = sys.getswitchinterval()
        sys.setswitchinterval(min(_before, JOB_INTERVAL_S))


def job_ended() -> None:
    """A job's thread has ended (call on the GUI thread): with none left, the interval is what it was."""
    global _jobs
    if _jobs == 0:
        return
    _jobs -= 1
    if _jobs == 0:
        sys.setswitchinterval(_before)
