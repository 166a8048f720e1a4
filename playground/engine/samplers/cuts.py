"""What the truncating samplers share: the ``-inf`` of a removed token (typical-p, epsilon, eta, top-nσ, XTC,
mirostat) and the guard that keeps the likeliest tokens whatever a cut says (epsilon, eta, mirostat)."""

from __future__ import annotations

import torch

NEG_INF = float("-inf")


def protect_top(remove: torch.Tensor, logits: torch.Tensor, min_keep: int) -> torch.Tensor:
    """``remove`` with the ``min_keep`` highest logits kept whatever it said."""
    keep = torch.topk(logits, min(min_keep, logits.shape[-1]), dim=-1).indices
    return remove.scatter(-1, keep, False)
