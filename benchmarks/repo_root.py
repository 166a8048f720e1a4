"""Imported first by a benchmark that needs ``devtools/`` (tiny models, the llama-server build): puts the repository
root on ``sys.path``, as a benchmark runs as a script (``python benchmarks/bench_x.py``) with only its own folder
there, and ``devtools`` is not in the installed package."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
