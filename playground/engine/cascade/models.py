"""The cascade's two models: which cheap model answers first, what each costs per position, and a model's side of
the decode (its KV cache, read lazily: a model reads the positions it missed only when it is next asked)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn
from transformers import DynamicCache
from transformers.pytorch_utils import Conv1D

from playground.config import CascadeSettings, ConfigError
from playground.engine.forward import PREFILL_CHUNK, keep_last_logits
from playground.engine.quant.linear import QuantLinear
from playground.engine.run_context import NO_CONTEXT, RunContext
from playground.engine.variants import FirstLayers, QuantizedCopy, SmallModel, detail, variant
from playground.models.anatomy import anatomy_of
from playground.models.loaded import LoadedModel


@dataclass
class CheapModel:
    model: nn.Module
    kind: str  # "quantized" | "layers" | "model"
    detail: str


def make_cheap_model(lm: LoadedModel, cascade: CascadeSettings, context: RunContext = NO_CONTEXT) -> CheapModel:
    """The cheap model the settings name (``ConfigError`` when it cannot be made for this full model), from the
    variants' cache or built (the context's ``progress``; ``BuildStopped`` when its Stop comes during a build)."""
    from playground.models.loading import ModelLoadError

    if cascade.cheap == "quantized":
        made = variant(lm, QuantizedCopy.quick(cascade.cheap_quant), context)
    elif cascade.cheap == "layers":
        total = anatomy_of(lm.model).count  # ConfigError naming the family when it cannot be opened up
        made = variant(lm, FirstLayers(cascade.layers_for(total), setting="cheap_layers"))
    else:
        try:
            made = variant(lm, SmallModel(cascade.cheap_model), context)
        except ModelLoadError as error:
            raise ConfigError(f"the cheap model could not be loaded: {error}") from error
        except ConfigError as error:
            raise ConfigError(str(error).replace("draft model", "cheap model")) from error
    return CheapModel(made.model, made.kind, detail(made, lm.name))


def weight_macs(model: nn.Module) -> int:
    """Multiply-adds of a model's weights per position read: every linear layer once (the LM head included; a
    tied LM head is still a product). Attention over the cache is left out: it is the same for both models."""
    total = 0
    for module in model.modules():
        if isinstance(module, (nn.Linear, QuantLinear)):
            total += module.in_features * module.out_features
        elif isinstance(module, Conv1D):
            total += module.weight.numel()
    return total


class ModelSide:
    """One model of the cascade with its KV cache. Each position is read once, when the model is next asked for
    logits: a model that sat out several tokens reads them all in one pass (chunks of ``PREFILL_CHUNK``)."""

    def __init__(self, model: nn.Module, device: torch.device, cache: DynamicCache | None = None,
                 logits: torch.Tensor | None = None) -> None:
        self.model = model
        self.device = device
        self.cache = cache if cache is not None else DynamicCache(config=cast(Any, model).config)
        self._logits = logits  # [1, vocab] after the cache's last position, when it came with the cache
        self._logits_at = self.cache.get_seq_length() if logits is not None else -1
        self.passes = 0  # forward passes made through this side (the prefill's not counted)

    @property
    def read(self) -> int:
        """Positions in the cache (every one read exactly once: nothing is rolled back)."""
        return self.cache.get_seq_length()

    def next_logits(self, ids: list[int], context: RunContext = NO_CONTEXT) -> torch.Tensor | None:
        """Float logits [1, vocab] for the token after ``ids``, reading the positions not yet in the cache; None
        when the run's Stop (``context``; by default none) came between two chunks of a long catch-up."""
        if self._logits_at == len(ids):
            return self._logits
        feed = ids[self.read :]
        assert feed, "the cache already holds every position but has no logits for the next one"
        out = None
        for start in range(0, len(feed), PREFILL_CHUNK):
            if start and context.stopped():
                return None
            chunk = torch.tensor([feed[start : start + PREFILL_CHUNK]], device=self.device)
            out = self.model(input_ids=chunk, cache=self.cache, use_cache=True, **keep_last_logits(self.model, 1))
            self.passes += 1
        assert out is not None  # feed is not empty
        self._logits = out.logits[:, -1, :].float()
        self._logits_at = len(ids)
        return self._logits
