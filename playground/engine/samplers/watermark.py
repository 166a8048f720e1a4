"""The watermark as the chain's entry (``playground.config.samplers.watermark``): Kirchenbauer's green lists (pure:
the ids seed them; any strategy, any batch of rows) or SynthID-Text's tournament (its context starts where the
generation starts: a strategy that carries the run, sampling; greedy is refused by name)."""

from __future__ import annotations

from typing import Any

import torch

from playground.config.errors import ConfigError
from playground.config.samplers.watermark import WatermarkSettings
from playground.engine.samplers.base import BuildContext, Sampler, engine_sampler
from playground.watermarking import GreenLists, SynthID, kirchenbauer_key, synthid_key


@engine_sampler
class Watermark(Sampler):
    declares = "watermark"
    name = "watermark"

    def __init__(self, settings: WatermarkSettings, vocab_size: int | None) -> None:
        self.settings = settings
        self.vocab_size = vocab_size
        self.lists: GreenLists | None = None
        self.synthid = SynthID(synthid_key(settings)) if settings.watermark == "synthid" else None
        self.start: int | None = None  # SynthID: where the generated tokens begin (set by the first call)

    @classmethod
    def build(cls, settings: Any, context: BuildContext) -> Sampler:
        g = settings.group(WatermarkSettings)
        if g.watermark == "synthid" and context.run is None:
            raise ConfigError(f"the SynthID watermark is not available with the {settings.strategy} strategy (its "
                              "context follows the generated tokens one by one); use the sample strategy, or the "
                              "kirchenbauer watermark")
        return cls(g, context.vocab_size)

    def green_lists(self, vocab: int) -> GreenLists:
        if self.lists is None:
            self.lists = GreenLists.of(kirchenbauer_key(self.settings, self.vocab_size or vocab))
        return self.lists

    def apply(self, ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        if self.synthid is None:
            return self.green_lists(logits.shape[-1]).apply(ids, logits)[0]
        if self.start is None:
            self.start = ids.shape[1]
        return self.synthid.apply(ids, logits, self.start)[0]

    def reset(self) -> None:
        self.start = None

    def snapshot(self) -> int | None:
        return self.start

    def restore(self, state: int | None) -> None:
        self.start = state
