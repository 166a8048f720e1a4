"""Model calls shared by the strategies: the prefill that fills the KV cache, and timing that waits for the device."""

from __future__ import annotations

import inspect
from typing import Any

import torch
from transformers import DynamicCache


def sync_device(device: torch.device) -> None:
    """Wait for the device's queued work, so timings measure the work and not just its launch."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def prefill(model: Any, prompt: torch.Tensor) -> tuple[torch.Tensor, DynamicCache]:
    """The prompt [1, prompt_len] through the model once; returns last-position logits [1, vocab] and the cache.

    Only the last position's logits are computed where the model allows it (``logits_to_keep``), as ``generate``
    does: the others would be a [prompt_len, vocab] matrix nobody reads.
    """
    cache = DynamicCache(config=model.config)
    extra = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
    out = model(input_ids=prompt, cache=cache, use_cache=True, **extra)
    return out.logits[:, -1, :], cache
