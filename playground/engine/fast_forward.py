"""Fast-forward tokens from one batched pass (greedy and sampling under a constraint).

Where the constraint fixes the next tokens without a choice (each the only token its state allows:
``Grammar.forced_run``), the step that needs a model pass feeds them together with the newest token: one forward
pass, one extension of the KV cache by all of them. The pass's logits at each position serve the fixed tokens' own
steps and then the next free step. The fixed tokens stay real steps:

- every sampler runs on their logits, the run's generator draws as it would step by step, and the record is marked
  ``GrammarStep.fast_forward`` (its probabilities are the pass's, at its position);
- each is a step of the decode loop, so Stop comes between them, the budget counts them, and stop strings and end
  tokens cut them;
- a ban's rollback can undo them.

The rows a pass computed ahead serve only while the run follows them. A rollback (the cache cropped below the
pass) or a different token (taken by hand in step mode) drops them, and the cache is cropped back to the kept tokens
before the next pass. It is off (step by step) while an observer watches the model's passes or measures each
step (the lens records one position per pass, the attention rows and KV measurements one per step).

The step's ``kv_cache_bytes`` is the cache as it is: at a fast-forward step it already holds the tokens fed ahead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from playground.engine.observe import overrides
from playground.engine.samplers.grammar import Grammar
from playground.engine.speculative.rollback import roll_back
from playground.models.loaded import LoadedModel

MAX_RUN = 256  # fixed tokens fed in one pass at most (a longer run takes several)


@dataclass
class Ahead:
    """What one batched pass computed: ``rows[j]`` ([vocab] float32) are the logits for the token at position
    ``start + j`` (generated tokens before it), after the newest token and ``fed[:j]``."""

    start: int
    fed: tuple[int, ...]  # the fixed tokens fed after the newest one, for positions start, start + 1, ...
    rows: torch.Tensor  # [len(fed) + 1, vocab]
    cached: int  # the cache's length after the pass


class FastForward:
    """The model passes of one greedy or sampling run. ``grammar``: the run's constraint (None: one token per pass)."""

    def __init__(self, lm: LoadedModel, loop: Any, grammar: Grammar | None) -> None:
        self.lm, self.loop, self.grammar = lm, loop, grammar
        watched = any(overrides(o, hook) for o in loop.observers for hook in ("watch", "after_step", "step_events"))
        self.on = grammar is not None and not watched
        self.ahead: Ahead | None = None

    def next_logits(self) -> tuple[torch.Tensor, int | None]:
        """The logits [1, vocab] (float32) for the token about to be decoded, and the token the constraint fixed
        there when the pass fed it (a fast-forward step), else None."""
        loop = self.loop
        position = len(loop.generated)
        ahead = self.ahead
        if ahead is not None:
            j = position - ahead.start
            if (0 < j < ahead.rows.shape[0] and loop.cache.get_seq_length() == ahead.cached
                    and tuple(loop.generated[ahead.start:position]) == ahead.fed[:j]):
                return ahead.rows[j : j + 1], ahead.fed[j] if j < len(ahead.fed) else None
            self.ahead = None  # the run left the rows: the cache keeps the tokens before the newest
            keep = len(loop.prompt_ids) + position - 1
            if loop.cache.get_seq_length() > keep:
                roll_back(loop.cache, keep)
        fixed: tuple[int, ...] = ()
        if self.on and self.grammar is not None and position >= len(loop.forced):
            fixed = self.grammar.forced_run(min(MAX_RUN, loop.max_steps - loop.taken))
        feed = loop.ids.last
        if fixed:
            feed = torch.cat([feed, torch.tensor([fixed], dtype=feed.dtype, device=feed.device)], dim=1)
        with loop.watching():
            logits = self.lm.model(input_ids=feed, cache=loop.cache, use_cache=True).logits
        if not fixed:
            return logits[:, -1, :].float(), None
        rows = logits[0].float()
        self.ahead = Ahead(position, fixed, rows, loop.cache.get_seq_length())
        return rows[0:1], fixed[0]
