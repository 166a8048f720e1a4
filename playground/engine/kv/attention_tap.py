"""The attention each forward pass computes, seen from inside the model's own attention call, whatever
implementation runs (sdpa or eager).

transformers looks up every attention layer's function by name (``config._attn_implementation`` in
``AttentionInterface``). ``observed(implementation)`` registers a function under ``observed-<implementation>``
that calls the real one with the same arguments and returns its output untouched, then, when a tap is active in
this thread, computes softmax(q·kᵀ·scaling [soft-capped] + mask) for the pass's query rows from the very q and k
the real function got (rotated, after the cache's update) and hands it to the tap. The mask function registered
under the same name is the real implementation's own, so the model builds the mask it always builds.

Only the rows asked for are computed: the last one (the view: the new token's row), or all of them when a cache
must score every query (H2O's accumulated attention).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, cast

import torch
from transformers import AttentionInterface, PreTrainedModel
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

PREFIX = "observed-"
_ACTIVE: ContextVar[AttentionTap | None] = ContextVar("playground_attention_tap", default=None)


class AttentionTap:
    """Receives each layer's attention probabilities [b, q_heads, rows, keys] during the passes it is active for.

    ``all_rows``: every query row of a pass (else the last only). ``consumers`` get (layer index, probs); the last
    row of every layer of the latest pass is kept in ``last_rows`` (layer -> [q_heads, keys] float32)."""

    def __init__(self, all_rows: bool = False, record: bool = True) -> None:
        self.all_rows, self.record = all_rows, record
        self.consumers: list[Callable[[int, torch.Tensor], None]] = []
        self.last_rows: dict[int, torch.Tensor] = {}

    def see(self, layer: int, probs: torch.Tensor) -> None:
        if self.record:
            self.last_rows[layer] = probs[0, :, -1].float()
        for consume in self.consumers:
            consume(layer, probs)

    def take(self) -> dict[int, torch.Tensor]:
        rows, self.last_rows = self.last_rows, {}
        return rows


def attention_probs(query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None, scaling: float,
                    softcap: float | None, rows: int) -> torch.Tensor:
    """softmax(q·kᵀ·scaling + mask) of the last ``rows`` queries: query [b, q_heads, q, d], key [b, kv_heads, k, d],
    mask [b, 1, q, k] (bool: True = may attend; float: added) or None (causal, the queries the newest positions)
    -> [b, q_heads, rows, k] float32."""
    q_heads, kv_heads = query.shape[1], key.shape[1]
    q = query[:, :, -rows:].float()
    k = key.float().repeat_interleave(q_heads // kv_heads, dim=1)  # [b, q_heads, k, d]
    scores = q @ k.transpose(-1, -2) * scaling  # [b, q_heads, rows, k]
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    if mask is not None:
        mask = mask[:, :, -rows:, : k.shape[-2]]
        scores = scores.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else scores + mask.float()
    elif query.shape[2] > 1:  # no mask given: causal, query i of q sits at key position k − q + i
        total, queries = k.shape[-2], query.shape[2]
        first = queries - rows
        row = torch.arange(first, queries, device=q.device)[:, None] + (total - queries)
        scores = scores.masked_fill(torch.arange(total, device=q.device)[None, :] > row, -math.inf)
    return scores.softmax(dim=-1)


def _real_function(implementation: str, module: torch.nn.Module) -> Callable[..., Any]:
    if implementation == "eager":  # eager is each family's own function, next to its attention class
        return sys.modules[type(module).__module__].eager_attention_forward
    return ALL_ATTENTION_FUNCTIONS[implementation]


def observed(implementation: str) -> str:
    """The name of ``implementation`` observed (registered on first use)."""
    name = PREFIX + implementation
    if name in ALL_ATTENTION_FUNCTIONS:
        return name

    def attend(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               attention_mask: torch.Tensor | None, *args: Any, **kwargs: Any) -> Any:
        out = _real_function(implementation, module)(module, query, key, value, attention_mask, *args, **kwargs)
        tap = _ACTIVE.get()
        if tap is not None:
            rows = query.shape[2] if tap.all_rows else 1
            scaling = kwargs.get("scaling", args[1] if len(args) > 1 else None)
            if scaling is None:
                scaling = query.shape[-1] ** -0.5
            probs = attention_probs(query, key, attention_mask, scaling, kwargs.get("softcap"), rows)
            tap.see(cast(int, module.layer_idx), probs)  # an attention module's index
        return out

    AttentionInterface.register(name, attend)
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[implementation])
    return name


def active_tap() -> AttentionTap | None:
    """The tap observing this thread's passes now, if any."""
    return _ACTIVE.get()


@contextmanager
def tapped(model: PreTrainedModel, tap: AttentionTap) -> Iterator[AttentionTap]:
    """The model's attention observed by ``tap`` for the block (this thread only), and back after."""
    before = model.config._attn_implementation
    base = before.removeprefix(PREFIX)
    model.set_attn_implementation(observed(base))
    token = _ACTIVE.set(tap)
    try:
        yield tap
    finally:
        _ACTIVE.reset(token)
        model.set_attn_implementation(before)
