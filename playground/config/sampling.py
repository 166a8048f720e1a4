"""Greedy decoding and sampling: the two strategies that read only the shared run settings (``config/run.py``:
the sampling section and the penalties), declared in the catalog here."""

from __future__ import annotations

from playground.config.catalog import Strategy, register_strategy
from playground.events import TokenStep

register_strategy(Strategy(
    "greedy", "always the most likely token (after the penalties)",
    sections=("penalties",), step_events=(TokenStep,), runner="playground.engine.sampling:run_sampling",
    takes_chooser=True, order=10))
register_strategy(Strategy(
    "sample", "draw from the processed distribution (temperature, top-k, top-p, min-p)",
    sections=("sampling", "penalties"), step_events=(TokenStep,), runner="playground.engine.sampling:run_sampling",
    takes_chooser=True, order=20))
