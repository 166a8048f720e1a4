"""Imported first by a benchmark that needs the tests' support code (``tests/support/``: tiny models, the
llama-server build): puts ``tests/`` on ``sys.path``, as a benchmark runs as a script (``python
benchmarks/bench_x.py``) with only its own folder there, and the support code is not in the installed package."""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))
