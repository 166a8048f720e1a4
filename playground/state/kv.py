"""Qt-free: folds a KV-cache run's events into what the KV-cache view shows.

Per step (one ``KVStep`` each): the cache's measured bytes in total and per layer, what the formula says they
should be, the process's memory, and the tokens held; the position of the prefill among the steps; the paged
cache's latest block tables; the positions a cache that keeps less has evicted (sinks, H2O) or holds quantized (KIVI);
the two phases on the roofline; and the with/without-cache comparison and the batch sweep when the run measured them.

Per-step series are NumPy arrays that grow with capacity doubling (the layers × steps matrix by whole columns), so
folding an event costs time proportional to that event: a view can refresh often on a long run.
"""

from __future__ import annotations

from typing import cast

import numpy as np

from playground.events import Event, PrefillDone, RunStarted
from playground.events.kv import KVBlocks, KVCompare, KVPhase, KVStarted, KVStep, KVSweep
from playground.state.fold import STATUS, Fold

# Its parts: the steps' bytes (and the prefill), the prefill/decode phases, the no-cache comparison, the batch sweep.
STEPS, PHASES, COMPARE, SWEEP = "steps", "phases", "compare", "sweep"

FIRST_CAPACITY = 64  # steps reserved before the first one; doubled when full
# What a position of a cache that keeps less holds (``KVState.position_map``).
FULL, EVICTED, QUANTIZED = 0, 1, 2


class _Growing:
    """An int64 series (``rows`` None) or a rows × steps matrix that grows by one step at a time (amortised)."""

    def __init__(self, rows: int | None = None) -> None:
        self.rows = rows
        self.data = np.zeros(FIRST_CAPACITY if rows is None else (rows, FIRST_CAPACITY), dtype=np.int64)
        self.size = 0

    def append(self, value) -> None:
        if self.size == self.data.shape[-1]:
            grown = np.zeros((*self.data.shape[:-1], 2 * self.size), dtype=np.int64)
            grown[..., : self.size] = self.data
            self.data = grown
        if self.rows is None:
            self.data[self.size] = value
        else:
            column = np.zeros(self.rows, dtype=np.int64)  # a short column (a malformed step) is padded with 0
            values = np.asarray(value, dtype=np.int64)[: self.rows]
            column[: values.size] = values
            self.data[:, self.size] = column
        self.size += 1

    @property
    def view(self) -> np.ndarray:
        """The filled part (a view: copy it to keep it past the next append)."""
        return self.data[..., : self.size]


class KVState(Fold):
    """The KV-cache record of one run. ``apply(event)`` folds an event in; ``reset()`` empties it."""

    parts = frozenset({STEPS, PHASES, COMPARE, SWEEP})
    start_event = KVStarted
    started: KVStarted | None

    def _clear(self) -> None:
        self.prompt_tokens: int | None = None  # from the run's start (the prefill's, once it came)
        self.model_dtype = ""  # the model's dtype (what "model" means as a KV dtype)
        self.prefill: PrefillDone | None = None
        self.prefill_position: int | None = None  # KV steps folded when the prefill ended (where to mark it)
        self.last: KVStep | None = None
        self.blocks: KVBlocks | None = None  # the latest step's block tables (paged cache only)
        self.phases: dict[str, KVPhase] = {}
        self.compare: KVCompare | None = None
        self.sweep: KVSweep | None = None
        self.evicted: set[int] = set()  # positions no layer or head holds any more (evicting caches)
        self._steps = _Growing()
        self._tokens = _Growing()
        self._total = _Growing()
        self._formula = _Growing()
        self._process = _Growing()
        self._reserved = _Growing()
        self._layers: _Growing | None = None

    # --- folding events -------------------------------------------------------------------------------------
    def _run_started(self, event: RunStarted) -> None:
        self.prompt_tokens = len(event.prompt_token_ids)
        self.model_dtype = event.dtype

    def _fold(self, event: Event) -> set[str] | None:
        if isinstance(event, KVStarted):
            if self._layers is None:
                self._layers = _Growing(event.layers)
        elif isinstance(event, PrefillDone):
            self.prefill = event
            self.prompt_tokens = event.prompt_tokens
            self.prefill_position = self.count
            return {STEPS, STATUS}
        elif isinstance(event, KVStep):
            self._add_step(event)
            return {STEPS, STATUS}
        elif isinstance(event, KVPhase):
            self.phases[event.phase] = event
            return {PHASES, STATUS}
        elif isinstance(event, KVCompare):
            self.compare = event
            return {COMPARE, STATUS}
        elif isinstance(event, KVSweep):
            self.sweep = event
            return {SWEEP, STATUS}
        return None

    def _add_step(self, step: KVStep) -> None:
        if self._layers is None:  # no KVStarted (a damaged trace): the first step says how many layers
            self._layers = _Growing(len(step.layer_bytes))
        self._steps.append(step.step)
        self._tokens.append(step.tokens)
        self._total.append(step.total_bytes)
        self._formula.append(step.formula_bytes)
        self._process.append(step.process_bytes)
        self._reserved.append(step.device_reserved_bytes)
        self._layers.append(step.layer_bytes)
        self.last = step
        self.evicted.update(step.evicted)
        if step.blocks is not None:
            self.blocks = step.blocks

    # --- reading ----------------------------------------------------------------------------------------------

    @property
    def count(self) -> int:
        """KV steps folded."""
        return self._steps.size

    @property
    def steps(self) -> np.ndarray:
        return self._steps.view

    @property
    def tokens(self) -> np.ndarray:
        """Positions held per sequence after each step."""
        return self._tokens.view

    @property
    def total_bytes(self) -> np.ndarray:
        return self._total.view

    @property
    def formula_bytes(self) -> np.ndarray:
        return self._formula.view

    @property
    def process_bytes(self) -> np.ndarray:
        return self._process.view

    @property
    def reserved_bytes(self) -> np.ndarray:
        return self._reserved.view

    @property
    def layer_bytes(self) -> np.ndarray:
        """Layers × steps (row 0 = the first decoder layer)."""
        if self._layers is None:
            return np.zeros((0, 0), dtype=np.int64)
        return self._layers.view

    @property
    def layers(self) -> int:
        return cast(int, self._layers.rows) if self._layers is not None else 0  # a matrix: it has rows

    @property
    def holder(self) -> str:
        """"contiguous", "paged" or "none" ("" before the run said)."""
        return self.started.holder if self.started is not None else ""

    @property
    def sequences(self) -> int:
        """Sequences the cache holds: the paged cache's block tables, else one."""
        return max(len(self.blocks.tables), 1) if self.blocks is not None else 1

    def measured_bytes_per_token(self) -> float | None:
        """The latest step's measured bytes ÷ the positions it holds (all sequences)."""
        last = self.last
        if last is None or last.tokens <= 0:
            return None
        return last.total_bytes / (last.tokens * self.sequences)

    def contiguous_reserved_bytes(self) -> float | None:
        """What a contiguous cache reserved up front for ``max_length`` would hold (formula, all sequences)."""
        s = self.started
        if s is None or s.max_length <= 0:
            return None
        return s.max_length * s.formula_bytes_per_token * self.sequences

    def last_block_fill(self) -> list[int]:
        """Per sequence: positions used in its last block (1 … block size; 0 for a sequence with no block)."""
        blocks, last, started = self.blocks, self.last, self.started
        if blocks is None or last is None or started is None or started.block_size <= 0:
            return [0] * (len(blocks.tables) if blocks is not None else 0)
        size = started.block_size
        return [0 if not table else max(0, min(size, last.tokens - (len(table) - 1) * size))
                for table in blocks.tables]

    def position_map(self) -> list[tuple[str, np.ndarray]]:
        """A contiguous cache that keeps less, after the latest step: per row (its name, per position fed so far
        ``FULL``, ``EVICTED`` or ``QUANTIZED``). Sinks and H2O: one row, a position evicted once no layer or head holds
        it (H2O's heads keep different positions). KIVI: keys and values, quantized past its full-precision residual
        (``kivi_counts``: whole blocks of ``residual`` keys, every value older than the newest ``residual``); its
        sliding-window layers (if any) stay in the model's dtype. Empty for every other cache."""
        started, last = self.started, self.last
        if started is None or last is None or started.holder != "contiguous":
            return []
        if started.keep != "all":
            fed = max((self.prompt_tokens or 0) + last.step, last.tokens, max(self.evicted, default=-1) + 1)
            row = np.full(fed, FULL, dtype=np.int8)
            row[sorted(self.evicted)] = EVICTED
            return [("positions", row)]
        residual = started.kivi_residual
        if started.kivi_group <= 0 or residual <= 0:
            return []
        fed = last.tokens
        keys, values = np.full(fed, FULL, dtype=np.int8), np.full(fed, FULL, dtype=np.int8)
        keys[: fed // residual * residual] = QUANTIZED
        values[: max(0, fed - residual)] = QUANTIZED
        return [("keys", keys), ("values", values)]

    def compare_ratio(self) -> tuple[float, float] | None:
        """Without ÷ with the cache: for the last token, and over all tokens (total time ÷ total time)."""
        c = self.compare
        n = min(len(c.cached_ms), len(c.uncached_ms)) if c is not None else 0
        if c is None or not n or c.cached_ms[n - 1] <= 0 or sum(c.cached_ms[:n]) <= 0:
            return None
        return c.uncached_ms[n - 1] / c.cached_ms[n - 1], sum(c.uncached_ms[:n]) / sum(c.cached_ms[:n])
