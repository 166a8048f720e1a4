"""Qt-free: folds a run's recorded attention (``AttentionStarted``, ``AttentionRow``) into what the attention view
shows: per step, the layers × positions matrix of one head or the mean over heads (built on demand for the step
shown); over the run, the sink's share, attention against distance and the heavy hitters, accumulated as each row
comes (work proportional to the row); the position texts (prompt, then the output), and the positions an evicting
cache dropped (from ``KVStep.evicted``)."""

from __future__ import annotations

import numpy as np

from playground.events import Event, TokenStep
from playground.events.attention import AttentionRow, AttentionStarted
from playground.events.kv import KVQuality, KVStep
from playground.state.fold import STATUS, Fold

SINK_POSITIONS = 4  # "the sink": the first positions (StreamingLLM keeps 4)
ROWS = "rows"  # a part: the attention rows (the heat map and the run's summaries)
DISTANCE_EDGES = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 1 << 30)  # buckets of query − key


class AttentionState(Fold):
    parts = frozenset({ROWS})
    start_event = AttentionStarted
    started: AttentionStarted | None

    def _clear(self) -> None:
        self.rows: list[AttentionRow] = []
        self.texts: list[str] = []  # every position's text: the prompt's, then each generated token's
        self.evicted: dict[int, int] = {}  # position -> the step after which no layer held it
        self.quality: KVQuality | None = None
        self.accumulated = np.zeros(0)  # per position: weight summed over steps, mean over layers and heads
        self.sink_mass = 0.0  # summed over rows: mean over layers and heads of the weight on the sink positions
        self.distance_mass = np.zeros(len(DISTANCE_EDGES) - 1)  # per distance bucket, mean over layers and heads

    def _fold(self, event: Event) -> set[str] | None:
        if isinstance(event, AttentionStarted):
            self.texts = list(event.prompt_tokens)
        elif isinstance(event, AttentionRow):
            self._add_row(event)
        elif isinstance(event, TokenStep) and self.started is not None:
            self.texts.append(event.text)
        elif isinstance(event, KVStep) and event.evicted:
            for position in event.evicted:
                self.evicted.setdefault(position, event.step)
        elif isinstance(event, KVQuality):
            self.quality = event
        else:
            return None
        return {ROWS, STATUS}

    def _add_row(self, row: AttentionRow) -> None:
        self.rows.append(row)
        size = row.query_position + 1
        if self.accumulated.size < size:
            self.accumulated = np.concatenate((self.accumulated, np.zeros(max(size, 2 * self.accumulated.size)
                                                                          - self.accumulated.size)))
        heads = sum(len(layer) for layer in row.positions) or 1
        edges = np.asarray(DISTANCE_EDGES)
        for layer_positions, layer_weights in zip(row.positions, row.weights, strict=True):
            for positions, weights in zip(layer_positions, layer_weights, strict=True):
                p, w = np.asarray(positions, dtype=np.int64), np.asarray(weights) / heads
                np.add.at(self.accumulated, p, w)
                self.sink_mass += float(w[p < SINK_POSITIONS].sum())
                bucket = np.searchsorted(edges, row.query_position - p, side="right") - 1
                np.add.at(self.distance_mass, bucket, w)

    @property
    def steps(self) -> int:
        return len(self.rows)

    @property
    def positions(self) -> int:
        return self.rows[-1].query_position + 1 if self.rows else len(self.texts)

    def matrix(self, step: int, head: int | None) -> np.ndarray:
        """[layers, positions of that step's query + 1]: the weight of each position in each layer, for ``head``
        (None: the mean over heads). Positions a top-k recording left out are 0 (their mass is in ``rest``)."""
        row = self.rows[step]
        out = np.zeros((len(row.positions), row.query_position + 1))
        for layer, (layer_positions, layer_weights) in enumerate(zip(row.positions, row.weights, strict=True)):
            chosen = range(len(layer_positions)) if head is None else (head,)
            for h in chosen:
                np.add.at(out[layer], np.asarray(layer_positions[h], dtype=np.int64), layer_weights[h])
            out[layer] /= len(chosen)
        return out

    def rest(self, step: int, head: int | None) -> np.ndarray:
        """[layers]: the mass not listed (top-k recordings) for ``head`` or the mean over heads."""
        row = self.rows[step]
        return np.asarray([np.mean(r) if head is None else r[head] for r in row.rest])

    def sink_share(self) -> float:
        """The share of all attention (mean over steps, layers and heads) on the first ``SINK_POSITIONS``."""
        return self.sink_mass / self.steps if self.steps else 0.0

    def distance_profile(self) -> np.ndarray:
        """Per distance bucket (``DISTANCE_EDGES``): the mean share of attention at that distance from the query."""
        return self.distance_mass / self.steps if self.steps else self.distance_mass

    def heavy_hitters(self, count: int = 8) -> list[tuple[int, float]]:
        """The positions with the most attention accumulated over the run: (position, summed weight)."""
        order = np.argsort(-self.accumulated[: self.positions], kind="stable")[:count]
        return [(int(p), float(self.accumulated[p])) for p in order if self.accumulated[p] > 0]
