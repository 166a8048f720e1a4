"""Qt-free: folds the layer-wise events (logit lens, early exit, layer skip) into what the layers view shows.

Per generated token: each layer's lens entropy and top probability, its top candidates, whether its top token
agrees with the answering layer's, its residual update, the layer that answered (early exit) and the layers
skipped, and the token's text once its ``token`` event comes. For the heatmap, layers × tokens matrices of entropy
(and top probability, agreement, skipped) grow by whole columns with capacity doubling, so folding a token costs
time proportional to that token's layers.

``replay_exit`` is a what-if on the recorded lens, never a new run: where each token would have exited under
another threshold, the layer compute saved, and how many tokens would have changed. It is a first-order estimate:
a changed token would have changed every later token's context, which the recorded run cannot show.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from playground.events import BeamStep, Event, TokenStep
from playground.events.layers import LayersStarted, LayerStep
from playground.state.columns import GrowingColumns
from playground.state.fold import STATUS, Fold

LAYERS = "layers"  # a part: the layer map, the chosen token's layers and the exit replay

ENTROPY = "entropy"
MAX_PROB = "max-prob"
METRICS = (ENTROPY, MAX_PROB)


@dataclass
class LayerToken:
    """One generated token's pass through the layers (its ``text`` comes with the token event that follows)."""

    lens: LayerStep
    text: str | None = None
    token_id: int | None = None
    forced: bool = False

    @property
    def step(self) -> int:
        return self.lens.step

    @property
    def answer_layer(self) -> int:
        """The 1-based layer whose distribution gave the token (the last one unless it exited early)."""
        return self.lens.exit_layer or self.lens.layers_total

    def ran(self, layer: int) -> bool:
        """Whether 1-based ``layer`` ran for this token (its lens was recorded)."""
        return self.lens.layer_entropy[layer - 1] is not None



def _nan(values: tuple[float | None, ...]) -> list[float]:
    return [np.nan if v is None else float(v) for v in values]


class LayerState(Fold):
    """The layer-wise record of one run. ``apply(event)`` folds an event in; ``reset()`` empties it."""

    parts = frozenset({LAYERS})
    start_event = LayersStarted
    started: LayersStarted | None

    def _clear(self) -> None:
        self.layers = 0
        self.tokens: list[LayerToken] = []
        self._by_step: dict[int, int] = {}  # step -> index into tokens, until its token event comes
        self._entropy: GrowingColumns | None = None
        self._top_prob: GrowingColumns | None = None
        self._agrees: GrowingColumns | None = None  # 1 agrees with the answering layer, 0 not, NaN did not run
        self._skipped: GrowingColumns | None = None  # 1 skipped, 0 not
        self.layers_computed = 0  # Σ over tokens
        self.layers_total = 0
        self.exits = 0  # tokens answered before the last layer

    # --- folding events -------------------------------------------------------------------------------------
    def _fold(self, event: Event) -> set[str] | None:
        if isinstance(event, LayersStarted):
            self._ensure_layers(event.layers)
        elif isinstance(event, LayerStep):
            self._add_step(event)
        elif not ((isinstance(event, TokenStep) and self._add_token(event))
                  or (isinstance(event, BeamStep) and self._add_beam_step(event))):
            return None
        return {LAYERS, STATUS}

    def _ensure_layers(self, layers: int) -> None:
        if self._entropy is None:
            self.layers = layers
            self._entropy, self._top_prob = GrowingColumns(layers), GrowingColumns(layers)
            self._agrees, self._skipped = GrowingColumns(layers), GrowingColumns(layers, 0.0)

    def _add_step(self, step: LayerStep) -> None:
        self._ensure_layers(len(step.layer_entropy))  # a view fed without LayersStarted still works
        assert self._entropy is not None and self._top_prob is not None  # made by _ensure_layers, as the others
        assert self._agrees is not None and self._skipped is not None
        self._by_step[step.step] = len(self.tokens)
        self.tokens.append(LayerToken(step))
        self._entropy.append(_nan(step.layer_entropy))
        self._top_prob.append(_nan(step.layer_top_prob))
        self._agrees.append(_nan(step.agrees_with_final))
        skipped = [0.0] * self.layers
        for layer in step.skipped:
            skipped[layer - 1] = 1.0
        self._skipped.append(skipped)
        self.layers_computed += step.layers_computed
        self.layers_total += step.layers_total
        self.exits += step.exit_layer is not None and step.exit_layer < step.layers_total

    def _add_token(self, step: TokenStep) -> bool:
        index = self._by_step.pop(step.step, None)
        if index is None:  # a token without a pass through the layers recorded (not ours to show)
            return False
        token = self.tokens[index]
        token.text, token.token_id, token.forced = step.text, step.token_id, step.forced
        return True

    def _add_beam_step(self, step: BeamStep) -> bool:
        """Beam search records the lens of the row the best beam grew from: its token is the step's first."""
        index = self._by_step.pop(step.step, None)
        if index is None or not step.token_ids:
            return False
        token = self.tokens[index]
        token.token_id = step.token_ids[0]
        token.text = next((c.text for c in step.candidates if c.token_id == step.token_ids[0]), "")
        return True


    # --- reading ----------------------------------------------------------------------------------------------

    @property
    def mode(self) -> str:
        return self.started.mode if self.started is not None else "lens"

    def _matrix(self, columns: GrowingColumns | None) -> np.ndarray:
        return columns.view if columns is not None else np.zeros((0, 0))

    @property
    def entropy(self) -> np.ndarray:
        """Entropy in bits, layers × tokens (row 0 = layer 1); NaN where a layer did not run."""
        return self._matrix(self._entropy)

    @property
    def top_prob(self) -> np.ndarray:
        return self._matrix(self._top_prob)

    @property
    def agrees(self) -> np.ndarray:
        return self._matrix(self._agrees)

    @property
    def skipped(self) -> np.ndarray:
        return self._matrix(self._skipped)

    @property
    def compute_saved(self) -> float | None:
        """Share of the layer passes the run did not make (early exits, skips); None before any token."""
        return 1.0 - self.layers_computed / self.layers_total if self.layers_total else None


@dataclass(frozen=True)
class Replay:
    """Early exit replayed on the recorded lens (a what-if: nothing was regenerated)."""

    metric: str
    threshold: float
    min_layer: int
    exits: tuple[int | None, ...]  # per token: the 1-based layer it would exit at; None: unknown
    changed: tuple[bool | None, ...]  # per token: its top token there differs from the answering layer's
    layers_computed: int  # over the known tokens (skipped layers below the exit not counted)
    layers_total: int  # known tokens × layers

    @property
    def known(self) -> int:
        return sum(e is not None for e in self.exits)

    @property
    def unknown(self) -> int:
        return len(self.exits) - self.known

    @property
    def changes(self) -> int:
        return sum(c is True for c in self.changed)

    @property
    def compute_saved(self) -> float | None:
        """1 − Σ exit layers / (known tokens × layers); None when no token is known."""
        return 1.0 - self.layers_computed / self.layers_total if self.layers_total else None


def replay_exit(state: LayerState, metric: str, threshold: float, min_layer: int) -> Replay:
    """Where each recorded token would exit: the first layer ≥ ``min_layer`` whose entropy is ≤ ``threshold`` bits
    (``"entropy"``) or whose top probability is ≥ ``threshold`` (``"max-prob"``), else the last layer.

    A token is unknown when a layer the rule must read did not run (after the run's own early exit); skipped
    layers cannot answer and are passed over. A token changes when the exit layer's top token differs from the
    answering layer's (the token greedy decoding chose) — first order only: the context of later tokens would differ.
    """
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {', '.join(METRICS)}, not {metric!r}")
    layers, n = state.layers, len(state.tokens)
    if n == 0 or layers == 0:
        return Replay(metric, threshold, min_layer, (), (), 0, 0)
    low = min(max(min_layer, 1), layers) - 1  # 0-based first row allowed to answer
    values = state.entropy if metric == ENTROPY else state.top_prob
    with np.errstate(invalid="ignore"):
        confident = values <= threshold if metric == ENTROPY else values >= threshold  # NaN: False
    confident[:low] = False
    exit_rows = np.where(confident.any(axis=0), confident.argmax(axis=0), layers - 1)
    # A row the rule reads (low … exit) that neither ran nor was skipped makes the token unknown.
    missing = np.isnan(values) & (state.skipped == 0)
    missing[:low] = False
    first_missing = np.where(missing.any(axis=0), missing.argmax(axis=0), layers)
    known = first_missing > exit_rows
    columns = np.arange(n)
    agrees = state.agrees[exit_rows, columns]
    skipped_below = np.cumsum(state.skipped, axis=0)[exit_rows, columns]
    computed = exit_rows + 1 - skipped_below
    exits = tuple(int(r) + 1 if k else None for r, k in zip(exit_rows, known, strict=True))
    changed = tuple(bool(a == 0) if k else None for a, k in zip(agrees, known, strict=True))
    return Replay(metric, threshold, min_layer, exits, changed, int(computed[known].sum()), int(known.sum()) * layers)
