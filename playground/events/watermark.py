"""A watermarked run's events: what the watermark is (``WatermarkStarted``, right after ``start``) and, right before
each generated token's own event, what it did there (``WatermarkStep``, same ``step``).

Each step says whether the token counts for the score (``scored``), its colour (green 1 / red 0; SynthID: its
g-values, one per tournament layer, and their mean), the running score over the generated tokens so far (z-score
and one-sided p-value, the count scored), the model's entropy where the token was drawn (bits: a low-entropy step
carries little signal, whatever its colour) and the KL divergence from the model's distribution to the watermarked
one at that step (nats, on the raw distribution at temperature 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True)
class WatermarkStarted:
    type: ClassVar[str] = "watermark_start"
    scheme: str  # "kirchenbauer" or "synthid"
    summary: str  # the key in words (γ, δ, seeding; n-gram length, keys)
    threshold: float  # the detector's z threshold
    greenlist_ratio: float = 0.25  # γ: the share green by chance (Kirchenbauer)
    depth: int = 0  # SynthID's tournament layers (its keys)
    skipped: int = 0  # tokens at the start that only seed (the first n-gram's context)


@dataclass(frozen=True)
class WatermarkStep:
    type: ClassVar[str] = "watermark_step"
    step: int
    token_id: int
    scored: bool  # counts for the score (False: a repeated SynthID context, a skipped first call)
    colour: float  # 1 green, 0 red; SynthID: the mean of ``g_values``
    g_values: tuple[int, ...]  # SynthID: the token's g-value at each layer (empty for green lists)
    z_score: float  # over the generated tokens so far (nan until one is scored)
    p_value: float
    count: int  # tokens scored so far
    entropy: float | None  # bits, of the model's distribution where the token was drawn (None: not known)
    kl: float | None  # nats, KL(watermarked ‖ model) at this step (None: not known)
