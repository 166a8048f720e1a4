"""transformers' repetition penalty (``RepetitionPenaltyLogitsProcessor``, checked against it in tests) as a pure
function that never modifies its input, and its engine object.

ids: [batch, seq] token ids so far (prompt + generated), logits: [batch, vocab].
"""

from __future__ import annotations

import torch

from playground.engine.samplers.base import stateless


def apply_repetition_penalty(ids: torch.Tensor, logits: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL's penalty: a token already in ``ids`` has its logit divided by ``penalty`` (multiplied if negative)."""
    seen = torch.gather(logits, 1, ids)
    seen = torch.where(seen < 0, seen * penalty, seen / penalty)
    return logits.scatter(1, ids, seen)


stateless("repetition_penalty", lambda s, c: ("repetition_penalty", lambda i, x: apply_repetition_penalty(
    i, x, s.repetition_penalty)))
