"""KV-cache accounting: measured bytes of a transformers cache, and the formula they should equal.

The formula is per layer type (``models.anatomy.kv_layout``): a full-attention layer holds every token of the
sequence; a sliding-window layer of window w holds at most the newest w − 1 between steps, as transformers'
``DynamicSlidingWindowLayer`` keeps them (the next query is the w-th position of its own window, so it needs no
older key). Mistral slides every layer, Gemma 2 / 3 alternate sliding and full layers; everything else is full.
"""

from __future__ import annotations

from typing import Any

import torch

from playground.models.anatomy import SLIDING, KVLayout, kv_layout


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


def tokens_held(layout: KVLayout, tokens: int) -> tuple[int, ...]:
    """Per layer: the positions a cache holds (per sequence) between steps once ``tokens`` have been fed: all of
    them on a full-attention layer, the newest ``window − 1`` at most on a sliding one."""
    return tuple(min(tokens, window - 1) if kind == SLIDING and window else tokens
                 for kind, window in zip(layout.layer_types, layout.windows, strict=True))


def kv_layer_formula(config: Any, tokens: int, bytes_per_element: float, sequences: int = 1) -> tuple[float, ...]:
    """Per layer: 2 (K and V) × kv_heads × head_dim × positions held (``tokens_held``) × bytes per element ×
    sequences (not rounded: ``bytes_per_element`` may be 0.5 for int4, whose scales this formula leaves out)."""
    layout = kv_layout(config)
    width = 2 * layout.kv_heads * layout.head_dim * bytes_per_element * sequences
    return tuple(width * held for held in tokens_held(layout, tokens))


def kv_formula_bytes(config: Any, tokens: int, bytes_per_element: float, sequences: int = 1) -> int:
    """All layers' ``kv_layer_formula``, rounded to a byte: what a cache holding exactly the positions each layer's
    attention can still read takes after ``tokens`` positions."""
    return round(sum(kv_layer_formula(config, tokens, bytes_per_element, sequences)))


def kv_bytes_per_token(config: Any, dtype: torch.dtype) -> int:
    """2 (K and V) x layers x kv_heads x head_dim x bytes per element: what one more token costs while every layer
    still holds every token (always, for a model without sliding-window layers; ``kv_formula_bytes`` is the
    size at a given length on any model)."""
    layout = kv_layout(config)
    element = torch.empty((), dtype=dtype).element_size()
    return 2 * layout.count * layout.kv_heads * layout.head_dim * element
