"""Caches that keep less, as transformers ``Cache`` objects the real decode runs on: one that evicts positions
(StreamingLLM's sinks + window, H2O's heavy hitters) and KIVI's quantized one. The rules are ``evict`` and ``kivi``.

Rotary positions. The model rotates keys *before* they reach the cache (``cache.update`` gets rotated keys), so a
kept key keeps the rotation of the position it was written at, and a new token's position id keeps counting from
the whole sequence (``get_seq_length`` is every position ever fed, not the number held). So the query at position
p sees a kept key of position j at its true distance p − j, as the full cache would. StreamingLLM's own code
instead stores keys before rotary and re-numbers positions inside the cache (so distances never exceed the cache
size, which lets it stream past the model's trained length); we keep the model's own rotary untouched, which is
exact for everything the cache still holds and needs no change to any family's attention, and we never run past
the model's context length anyway.

The mask. A layer reports ``get_mask_sizes`` as (held + new, offset = positions fed − held), as transformers'
sliding-window layer does: every held key is older than the new queries, so all of them are visible, and the
new keys are causal among themselves at their true positions, whichever positions were dropped.

Eviction runs after each layer's forward pass: for sinks + window at the end of ``update`` (the pass has its keys),
for heavy hitters once the pass's attention is known (``observe``, called by the attention tap with the pass's
attention probabilities, all query rows); a prompt read in chunks is evicted between chunks. Sliding-window layers
(Mistral, Gemma 2/3's local layers) keep transformers' own ``DynamicSlidingWindowLayer``: their window already
is their eviction, and they stay in the model's dtype under KIVI too.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicSlidingWindowLayer

from playground.engine.kv.evict import accumulate_attention, gather_positions, heavy_hitter_keep, sink_window_keep
from playground.engine.kv.kivi import (
    KIVI_BITS,
    dequantize_keys,
    dequantize_values,
    kivi_counts,
    quantize_keys,
    quantize_values,
)
from playground.engine.kv.quantized import layer_windows

KEEP_RULES = ("sinks", "h2o")


def _nbytes(*tensors: torch.Tensor | None) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


class EvictingLayer(CacheLayerMixin):
    """One full-attention layer's keys and values [b, kv_heads, held, d], with each held key's position
    [b, kv_heads, held] (per head: heavy hitters differ between heads) and, for H2O, its accumulated attention."""

    is_compileable = False
    is_sliding = False
    # Set by lazy_initialization before anything reads them (None before: is_initialized is False).
    keys: torch.Tensor
    values: torch.Tensor
    positions: torch.Tensor  # [b, h, held] long
    scores: torch.Tensor  # [b, h, held] float32 (H2O)

    def __init__(self, rule: str, sinks: int = 4, window: int = 64, budget: int = 128) -> None:
        if rule not in KEEP_RULES:
            raise ValueError(f"rule must be one of {KEEP_RULES} (got {rule!r})")
        self.rule, self.sinks, self.window, self.budget = rule, sinks, window, budget
        self.reset()

    def reset(self) -> None:
        self.is_initialized = False
        self.cumulative_length = 0
        self.keys = self.values = self.positions = self.scores = None  # type: ignore[assignment]  # until the first update
        self.pass_positions: torch.Tensor | None = None  # positions of the keys the last pass read

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.keys, self.values = key_states[:, :, :0].clone(), value_states[:, :, :0].clone()
        b, h = key_states.shape[:2]
        self.positions = torch.zeros(b, h, 0, dtype=torch.long, device=self.device)
        self.scores = torch.zeros(b, h, 0, device=self.device)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        b, h, new = key_states.shape[:3]
        fed = torch.arange(self.cumulative_length, self.cumulative_length + new, device=self.device)
        self.cumulative_length += new
        self.keys = torch.cat((self.keys, key_states), dim=-2)
        self.values = torch.cat((self.values, value_states), dim=-2)
        self.positions = torch.cat((self.positions, fed.expand(b, h, new)), dim=-1)
        self.scores = torch.cat((self.scores, torch.zeros(b, h, new, device=self.device)), dim=-1)
        keys, values, self.pass_positions = self.keys, self.values, self.positions
        if self.rule == "sinks":
            self._keep(sink_window_keep(self.keys.shape[-2], self.sinks, self.window))
        return keys, values

    def observe(self, probs: torch.Tensor) -> None:
        """The pass's attention [b, q_heads, queries, held] over the keys ``update`` returned: H2O adds it to the
        scores and evicts down to the budget."""
        if self.rule != "h2o" or probs.shape[-1] != self.scores.shape[-1]:
            return
        self.scores = accumulate_attention(self.scores, probs)
        if self.scores.shape[-1] > self.budget:
            self._keep(heavy_hitter_keep(self.scores[0], self.budget, self.window))  # batch 1: one kept set

    def _keep(self, keep: torch.Tensor) -> None:
        if keep.shape[-1] == self.keys.shape[-2]:
            return
        self.keys, self.values = gather_positions(self.keys, keep), gather_positions(self.values, keep)
        self.positions = gather_positions(self.positions, keep)
        self.scores = gather_positions(self.scores, keep)

    @property
    def held(self) -> int:
        return self.keys.shape[-2] if self.is_initialized else 0

    def get_seq_length(self) -> int:
        return self.cumulative_length

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.held + query_length, self.cumulative_length - self.held

    def get_max_length(self) -> int:
        return -1

    @property
    def nbytes(self) -> int:
        """Keys and values held (positions and H2O's scores are bookkeeping: 12 bytes per head and position)."""
        return _nbytes(self.keys, self.values) if self.is_initialized else 0


class KIVILayer(CacheLayerMixin):
    """One full-attention layer under KIVI: quantized keys (per channel, groups of ``group`` tokens) and values
    (per token), and the newest keys and values in full precision (``kivi.kivi_counts``)."""

    is_compileable = False
    is_sliding = False
    # Set by lazy_initialization before anything reads them (None before: is_initialized is False).
    key_codes: torch.Tensor
    key_params: torch.Tensor
    value_codes: torch.Tensor
    value_params: torch.Tensor
    key_tail: torch.Tensor
    value_tail: torch.Tensor

    def __init__(self, bits: int, group: int = 32, residual: int = 32) -> None:
        if residual < group or residual % group:
            raise ValueError(f"KIVI's residual ({residual}) must be a positive multiple of its group ({group})")
        self.bits, self.group, self.residual = bits, group, residual
        self.reset()

    def reset(self) -> None:
        self.is_initialized = False
        self.cumulative_length = 0
        self.key_codes = self.key_params = self.value_codes = self.value_params = None  # type: ignore[assignment]
        self.key_tail = self.value_tail = None  # type: ignore[assignment]  # until the first update

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.key_codes, self.key_params = quantize_keys(key_states[:, :, :0], self.bits, self.group)
        self.value_codes, self.value_params = quantize_values(value_states[:, :, :0], self.bits, self.group)
        self.key_tail, self.value_tail = key_states[:, :, :0].clone(), value_states[:, :, :0].clone()
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """The pass reads what is stored and its own new positions in full precision (as KIVI's attention does);
        then whole blocks of ``residual`` keys and every value past the newest ``residual`` are quantized."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.cumulative_length += key_states.shape[-2]
        key_tail = torch.cat((self.key_tail, key_states), dim=-2)
        value_tail = torch.cat((self.value_tail, value_states), dim=-2)
        keys = torch.cat((dequantize_keys(self.key_codes, self.key_params, self.bits, self.dtype), key_tail), -2)
        values = torch.cat((dequantize_values(self.value_codes, self.value_params, self.bits, self.dtype),
                            value_tail), -2)
        keys_quantized, values_quantized = kivi_counts(self.cumulative_length, self.residual)
        spill = keys_quantized - self.key_codes.shape[-2]
        if spill > 0:
            codes, params = quantize_keys(key_tail[:, :, :spill], self.bits, self.group)
            self.key_codes = torch.cat((self.key_codes, codes), dim=-2)
            self.key_params = torch.cat((self.key_params, params), dim=2)
            key_tail = key_tail[:, :, spill:]
        spill = values_quantized - self.value_codes.shape[-2]
        if spill > 0:
            codes, params = quantize_values(value_tail[:, :, :spill], self.bits, self.group)
            self.value_codes = torch.cat((self.value_codes, codes), dim=-2)
            self.value_params = torch.cat((self.value_params, params), dim=2)
            value_tail = value_tail[:, :, spill:]
        self.key_tail, self.value_tail = key_tail, value_tail
        return keys, values

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Beam search: every stored part's rows in the order of ``beam_idx`` (codes, scales and tails alike)."""
        if not self.is_initialized:
            return
        index = beam_idx.to(self.device)
        for name in ("key_codes", "key_params", "value_codes", "value_params", "key_tail", "value_tail"):
            setattr(self, name, getattr(self, name).index_select(0, index))

    @property
    def held(self) -> int:
        return self.cumulative_length

    def get_seq_length(self) -> int:
        return self.cumulative_length

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.cumulative_length + query_length, 0

    def get_max_length(self) -> int:
        return -1

    @property
    def nbytes(self) -> int:
        """Codes, float32 steps and offsets, and the full-precision tails."""
        if not self.is_initialized:
            return 0
        return _nbytes(self.key_codes, self.key_params, self.value_codes, self.value_params, self.key_tail,
                       self.value_tail)


class CompressedCache(Cache):
    """A transformers ``Cache`` of ``EvictingLayer`` or ``KIVILayer`` for the full-attention layers and
    transformers' own sliding-window layers for the others. ``layer_bytes()`` is what each layer holds."""

    def __init__(self, config: Any, layer: Any) -> None:
        layers: list[Any] = [layer() if window is None else DynamicSlidingWindowLayer(sliding_window=window)
                  for window in layer_windows(config)]
        super().__init__(layers=layers)

    def layer_bytes(self) -> tuple[int, ...]:
        return tuple(_layer_nbytes(layer) for layer in self.layers)

    @property
    def nbytes(self) -> int:
        return sum(self.layer_bytes())

    def held_tokens(self) -> int:
        """Positions the most-holding layer holds per head (what the formula counts)."""
        return max((_held(layer) for layer in self.layers), default=0)

    def observe(self, layer_idx: int, probs: torch.Tensor) -> None:
        layer = self.layers[layer_idx]
        if isinstance(layer, EvictingLayer):
            layer.observe(probs)

    def key_positions(self, layer_idx: int) -> torch.Tensor | None:
        """Positions [b, kv_heads, keys] of the keys the layer's last pass read (None: the newest, in order)."""
        layer = self.layers[layer_idx]
        return layer.pass_positions if isinstance(layer, EvictingLayer) else None

    def held_positions(self) -> torch.Tensor:
        """Which positions at least one layer and head still holds: bool [positions fed]."""
        layers: list[Any] = list(self.layers)  # ours and transformers' sliding ones (its union type has neither)
        fed = max((layer.get_seq_length() for layer in layers), default=0)
        held = torch.zeros(fed, dtype=torch.bool)
        for layer in layers:
            if isinstance(layer, EvictingLayer) and layer.is_initialized:
                held[layer.positions.flatten().cpu()] = True
            elif layer.is_initialized:
                held[fed - _held(layer):] = True
        return held


def _held(layer: Any) -> int:
    if isinstance(layer, (EvictingLayer, KIVILayer)):
        return layer.held
    return layer.keys.shape[-2] if getattr(layer, "is_initialized", False) else 0


def _layer_nbytes(layer: Any) -> int:
    if isinstance(layer, (EvictingLayer, KIVILayer)):
        return layer.nbytes
    return _nbytes(layer.keys, layer.values) if getattr(layer, "is_initialized", False) else 0


def evicting_cache(config: Any, rule: str, sinks: int, window: int, budget: int) -> CompressedCache:
    """``rule`` "sinks": keep ``sinks`` + the newest ``window``; "h2o": keep ``budget`` positions, the newest
    ``window`` of them plus the heavy hitters (needs the attention tap to see the attention)."""
    return CompressedCache(config, lambda: EvictingLayer(rule, sinks=sinks, window=window, budget=budget))


def kivi_cache(config: Any, kv_dtype: str, group: int = 32, residual: int = 32) -> CompressedCache:
    return CompressedCache(config, lambda: KIVILayer(KIVI_BITS[kv_dtype], group=group, residual=residual))
