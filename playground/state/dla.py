"""What the "why this token" view shows, folded from a run's events (Qt-free):

- the uncertainty strip: each step's entropy and varentropy of the raw distribution (``TokenStep``) and its entropix
  quadrant (``quadrant``: the thresholds are entropix's sampler's, in bits and bits²);
- the commitment strip: for each emitted token, the first layer from which the lens (``LayerStep``) keeps it at
  top-1, and in its top 5, through the last layer (``commitment``);
- the logit attributions recorded for the run (``LogitAttribution``), by step.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from playground.events import Event, LayerStep, RunStarted, TokenStep
from playground.events.dla import AttributionMissing, LogitAttribution
from playground.events.layers import LayersStarted, LensCandidate
from playground.state.fold import Fold

# entropix (xjdr-alt/entropix, sampler.py): entropy H in bits, varentropy V in bits²
FLOWING, CAREFUL, FORKS, MIST, MIDDLE = "flowing", "careful", "forks", "mist", "middle"
QUADRANTS = {
    FLOWING: "H < 0.1 and V < 0.1: flowing (confident; argmax)",
    CAREFUL: "H > 3 and V < 0.1: treading carefully (uniformly unsure; clarify)",
    FORKS: "H < 5 and V > 5: exploring forks (a few distinct options; branch)",
    MIST: "H > 5 and V > 5: resampling in the mist (lost; resample hotter)",
    MIDDLE: "otherwise: the middle ground (adaptive sampling)",
}
TOP_K = 5  # the commitment strip's second row: kept within the lens's top 5

UNCERTAINTY, COMMITMENT, ATTRIBUTION = "uncertainty", "commitment", "attribution"


def quadrant(entropy: float, varentropy: float) -> str:
    """The step's entropix quadrant, in its sampler's order of checks."""
    if entropy < 0.1 and varentropy < 0.1:
        return FLOWING
    if entropy > 3.0 and varentropy < 0.1:
        return CAREFUL
    if entropy < 5.0 and varentropy > 5.0:
        return FORKS
    if entropy > 5.0 and varentropy > 5.0:
        return MIST
    return MIDDLE


def _kept_from(flags: Sequence[bool | None]) -> int | None:
    """1-based first layer from which every layer that ran holds the flag (None where none does at the end)."""
    ran = [(i, f) for i, f in enumerate(flags) if f is not None]
    if not ran or not ran[-1][1]:
        return None
    first = ran[-1][0]
    for i, flag in reversed(ran):
        if not flag:
            break
        first = i
    return first + 1


def commitment(layer_top: Sequence[Sequence[LensCandidate]], token_id: int, k: int = TOP_K
               ) -> tuple[int | None, int | None]:
    """(first layer keeping ``token_id`` at top-1, first keeping it within the top ``k``), 1-based, through the last
    layer that ran; None: the last layer does not hold it so (a sampled token that was not the top one)."""
    top1 = [(bool(c) and c[0].token_id == token_id) if c else None for c in layer_top]
    topk = [any(x.token_id == token_id for x in c[:k]) if c else None for c in layer_top]
    return _kept_from(top1), _kept_from(topk)


@dataclass(frozen=True)
class StepUncertainty:
    step: int
    text: str
    entropy: float  # bits
    varentropy: float | None  # bits² (None: a run saved before it was recorded)
    quadrant: str | None


@dataclass(frozen=True)
class Commitment:
    step: int
    top1: int | None  # 1-based layer
    topk: int | None


class DlaFold(Fold):
    parts = frozenset({UNCERTAINTY, COMMITMENT, ATTRIBUTION})

    def _clear(self) -> None:
        self.steps: list[StepUncertainty] = []
        self.tokens: dict[int, int] = {}  # step -> token id
        self.lens: dict[int, LayerStep] = {}  # step -> its lens, until its token comes
        self.commitments: list[Commitment] = []
        self.layers = 0
        self.lens_top = 0
        self.attributions: dict[int, LogitAttribution] = {}
        self.missing: list[str] = []
        self.prompt_tokens = 0

    def _run_started(self, event: RunStarted) -> None:
        self.prompt_tokens = len(event.prompt_token_ids)

    def _fold(self, event: Event) -> Iterable[str] | None:
        if isinstance(event, TokenStep):
            v = event.varentropy
            self.steps.append(StepUncertainty(event.step, event.text, event.entropy, v,
                                              quadrant(event.entropy, v) if v is not None else None))
            self.tokens[event.step] = event.token_id
            lens = self.lens.pop(event.step, None)
            return (UNCERTAINTY, COMMITMENT) if lens is not None and self._commit(lens) else (UNCERTAINTY,)
        if isinstance(event, LayersStarted):
            self.layers, self.lens_top = event.layers, event.lens_top
            return (COMMITMENT,)
        if isinstance(event, LayerStep):
            self.layers = self.layers or event.layers_total
            if event.step in self.tokens:
                return (COMMITMENT,) if self._commit(event) else None
            self.lens[event.step] = event
            return None
        if isinstance(event, LogitAttribution):
            self.attributions[event.step] = event
            return (ATTRIBUTION,)
        if isinstance(event, AttributionMissing):
            self.missing.append(event.what)
            return (ATTRIBUTION,)
        return None

    def _commit(self, lens: LayerStep) -> bool:
        top1, topk = commitment(lens.layer_top, self.tokens[lens.step])
        self.commitments.append(Commitment(lens.step, top1, topk))
        return True
