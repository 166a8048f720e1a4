"""transformers' n-gram ban (``NoRepeatNGramLogitsProcessor``, checked against it in tests) as a pure function
that never modifies its input, and its engine object.

ids: [batch, seq] token ids so far (prompt + generated), logits: [batch, vocab].
"""

from __future__ import annotations

import torch

from playground.engine.samplers.base import stateless


def ban_repeated_ngrams(ids: torch.Tensor, logits: torch.Tensor, ngram_size: int) -> torch.Tensor:
    """Forbid any token that would complete an n-gram already present in ``ids``."""
    seq_len = ids.shape[1]
    if seq_len < ngram_size:
        return logits
    # windows: [batch, n_windows, n]; a window whose first n-1 tokens equal the current suffix bans its last token
    windows = ids.unfold(1, ngram_size, 1)
    suffix = ids[:, seq_len - ngram_size + 1 :]
    matches = (windows[..., :-1] == suffix.unsqueeze(1)).all(dim=-1)  # [batch, n_windows]
    rows, at = matches.nonzero(as_tuple=True)  # the matching windows: a few, against the whole vocabulary
    out = logits.clone()
    out[rows, windows[rows, at, -1]] = float("-inf")
    return out


stateless("no_repeat_ngram", lambda s, c: ("no_repeat_ngram", lambda i, x: ban_repeated_ngrams(
    i, x, s.no_repeat_ngram_size)))
