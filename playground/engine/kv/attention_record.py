"""The attention tap's rows as events: every layer's new row over absolute positions, compactly."""

from __future__ import annotations

from typing import Any

import torch

from playground.events.attention import AttentionRow

DIGITS = 6  # weights rounded for the trace (a millionth of the mass)


def key_positions(cache: Any, layer: int, keys: int, end: int, kv_heads: int) -> torch.Tensor:
    """Absolute positions [kv_heads, keys] of the keys a layer's last pass read: the cache says (evicting caches),
    else they are the newest ``keys`` before ``end`` (full or sliding-window layers)."""
    positions_of = getattr(cache, "key_positions", None)
    held = positions_of(layer) if positions_of is not None else None
    if held is not None:
        return held[0].cpu()
    return torch.arange(end - keys, end).expand(kv_heads, keys)


def attention_row(step: int, rows: dict[int, torch.Tensor], cache: Any, end: int, top: int, kv_heads: int
                  ) -> AttentionRow:
    """``rows``: layer -> [q_heads, keys] probabilities of the pass's last query (position ``end − 1``); ``top``
    positions kept per layer and head (0: all)."""
    positions, weights, rest, held = [], [], [], []
    for layer in sorted(rows):
        row = rows[layer].cpu()  # [q_heads, keys]
        q_heads, keys = row.shape
        kv_pos = key_positions(cache, layer, keys, end, kv_heads)
        pos = kv_pos.repeat_interleave(q_heads // kv_pos.shape[0], dim=0)  # [q_heads, keys]
        count = keys if top == 0 else min(top, keys)
        best, index = row.topk(count, dim=-1)  # largest first
        chosen = torch.gather(pos, 1, index)
        positions.append(tuple(tuple(r) for r in chosen.tolist()))
        weights.append(tuple(tuple(round(w, DIGITS) for w in r) for r in best.tolist()))
        rest.append(tuple(round(max(0.0, 1.0 - s), DIGITS) for s in best.sum(dim=-1).tolist()))
        held.append(keys)
    return AttentionRow(step=step, query_position=end - 1, positions=tuple(positions), weights=tuple(weights),
                        rest=tuple(rest), held=tuple(held))

