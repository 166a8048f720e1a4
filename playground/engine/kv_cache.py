"""KV-cache accounting: measured bytes of a transformers cache, and the formula they should equal."""

from __future__ import annotations

from typing import Any

import torch


def kv_cache_bytes(cache: Any) -> int:
    """Bytes held by the keys and values of a transformers cache (all layers, all batch rows)."""
    if cache is None:
        return 0
    held = getattr(cache, "nbytes", None)  # paged and quantized caches know what they hold (reading is a copy)
    if isinstance(held, int):
        return held
    total = 0
    for layer in getattr(cache, "layers", ()):
        for tensor in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if isinstance(tensor, torch.Tensor):
                total += tensor.numel() * tensor.element_size()
    return total


def kv_bytes_per_token(config: Any, dtype: torch.dtype) -> int:
    """2 (K and V) x layers x kv_heads x head_dim x bytes per element."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    element = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_hidden_layers * kv_heads * head_dim * element
