"""A loaded model with what the engine needs to know about it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from playground.models.run_history import RunHistory


@dataclass
class LoadedModel:
    model: Any  # a transformers causal LM in eval mode
    tokenizer: Any
    name: str  # short display name
    path: str  # where it was loaded from
    device: torch.device
    dtype: torch.dtype
    # The name of the model these weights were made from, when they are a derived copy ("<model> · int4" keeps
    # "<model>"): a run of the copy can branch on the model itself. "" for a model as loaded.
    base_name: str = ""
    # This session's earlier runs on this model object (the suffix drafter's corpus): a copy made from it starts
    # its own (not an init field, so ``dataclasses.replace`` does not share it).
    history: RunHistory = field(default_factory=RunHistory, init=False, repr=False, compare=False)

    @property
    def own_name(self) -> str:
        return self.base_name or self.name

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).removeprefix("torch.")

    @property
    def context_length(self) -> int:
        config = self.model.config
        for attr in ("max_position_embeddings", "n_positions", "max_sequence_length"):
            value = getattr(config, attr, None)
            if isinstance(value, int) and value > 0:
                return value
        return 2048

    @property
    def vocab_size(self) -> int:
        """Rows of the model's head (often padded past the tokenizer's count): the ids a sampler or a green list
        covers."""
        return int(self.model.config.vocab_size)

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """EOS ids from the generation config (may be several), else the tokenizer's."""
        eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        if eos is None:
            eos = self.tokenizer.eos_token_id
        if eos is None:
            return ()
        return tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),)
