"""Which cached positions a smaller cache keeps: the rules of StreamingLLM and H2O as pure functions.

- **Attention sinks + window** (StreamingLLM, Xiao et al. 2023; ``StartRecentKVCache(start_size=4,
  recent_size=...)`` in mit-han-lab/streaming-llm): keep the first ``sinks`` positions, which soak up attention
  whatever they say, and the newest ``window``; drop everything between.
- **Heavy hitters** (H2O, Zhang et al. 2023; ``hh_size`` + ``recent_size`` in FMInference/H2O): keep the newest
  ``recent`` positions plus, among the older ones, the ``budget − recent`` with the largest attention accumulated
  over every query so far. The paper scores and evicts per head; a model with grouped-query attention shares one
  key among a group of query heads, so a kept key must serve the whole group: the score of a key head is the sum of
  its group's query heads (``accumulate_attention``), and eviction is per key head.

Every function returns indices into the held positions, ascending, so keys keep their order. Ties between equal
accumulated scores go to the older position (a stable sort), so kept sets are exact, not up to ``topk``'s whims.
"""

from __future__ import annotations

import torch


def sink_window_keep(held: int, sinks: int, window: int) -> torch.Tensor:
    """Indices [kept] of ``held`` positions to keep: the first ``sinks`` and the newest ``window`` (all of them when
    ``held <= sinks + window``)."""
    if sinks < 0 or window < 0:
        raise ValueError(f"sinks and window must be >= 0 (got {sinks}, {window})")
    if held <= sinks + window:
        return torch.arange(held)
    return torch.cat((torch.arange(sinks), torch.arange(held - window, held)))


def heavy_hitter_keep(scores: torch.Tensor, budget: int, recent: int) -> torch.Tensor:
    """scores: [..., held] accumulated attention per held position (per key head); returns indices [..., kept]
    (kept = min(held, budget)), ascending: the newest ``recent`` plus the ``budget − recent`` best-scored older
    positions. ``recent`` larger than the budget keeps the newest ``budget``."""
    if budget < 1 or recent < 0:
        raise ValueError(f"budget must be >= 1 and recent >= 0 (got {budget}, {recent})")
    held = scores.shape[-1]
    if held <= budget:
        return torch.arange(held).expand(*scores.shape[:-1], held)
    recent = min(recent, budget)
    older = held - recent
    heavy = budget - recent
    order = torch.sort(scores[..., :older], dim=-1, descending=True, stable=True).indices  # [..., older]
    chosen = torch.sort(order[..., :heavy], dim=-1).values  # [..., heavy] ascending
    newest = torch.arange(older, held).expand(*scores.shape[:-1], recent)
    return torch.cat((chosen, newest), dim=-1)


def accumulate_attention(scores: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """H2O's running score: ``scores`` [b, kv_heads, held] plus the attention ``probs`` [b, q_heads, queries, held]
    of one forward pass, summed over its queries and over each key head's group of query heads."""
    b, q_heads, _, held = probs.shape
    kv_heads = scores.shape[1]
    per_query_head = probs.float().sum(dim=2)  # [b, q_heads, held]
    return scores + per_query_head.view(b, kv_heads, q_heads // kv_heads, held).sum(dim=2)


def gather_positions(x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """x: [b, h, held, ...] (keys, values, scores, positions); keep: [held'] for every head or [h, kept] per head
    -> [b, h, kept, ...]."""
    if keep.dim() == 1:
        return x.index_select(2, keep.to(x.device))
    index = keep.to(x.device)[None]  # [1, h, kept]
    while index.dim() < x.dim():
        index = index.unsqueeze(-1)
    return torch.gather(x, 2, index.expand(x.shape[0], *keep.shape, *x.shape[3:]))
