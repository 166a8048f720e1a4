"""Who proposes the tokens the target verifies: four drafters behind one small interface.

- ``PromptLookupDrafter``: copies what followed an earlier occurrence of the text's last n-gram (no model): the
  latest one with k tokens after it.
- ``LayersDrafter``: the target's own first N layers, its final norm and LM head (LayerSkip's self-drafting);
  shares the target's weights, keeps its own KV cache (``playground.engine.variants`` makes every drafter model).
- ``ModelDrafter``: a separate small model with the target's tokenizer, its own KV cache; or the target's own
  quantized copy (``QuantizedDrafter``).
- ``JacobiDrafter``: the target refining a guess in parallel: each verification pass re-predicts every guessed
  position, and those predictions are the next guess (a Jacobi iteration towards the greedy fixed point).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers import DynamicCache

from playground.engine.processors import NamedTransform, run_pipeline
from playground.engine.speculative.rollback import keep_past, roll_back


@dataclass
class Draft:
    tokens: list[int]
    probs: torch.Tensor | None  # [len(tokens), vocab] q rows of a model drafter (processed); None: deterministic


class Drafter:
    name = ""
    detail = ""
    deterministic = True  # q is one-hot on the drafted token

    def propose(self, ids: list[int], k: int) -> Draft:
        raise NotImplementedError

    def after_round(self, kept: int, target_choices: list[int], accepted: int) -> None:
        """``kept``: tokens now confirmed (context + accepted drafts, before the target's own token);
        ``target_choices``: the target's argmax at each verified position."""


class PromptLookupDrafter(Drafter):
    name = "prompt-lookup"

    def __init__(self, max_ngram: int) -> None:
        self.max_ngram = max_ngram
        self.detail = f"longest n-gram {max_ngram}, latest match with a full continuation"

    def propose(self, ids: list[int], k: int) -> Draft:
        return Draft(lookup_continuation(ids, k, self.max_ngram), None)


def lookup_continuation(ids: list[int], k: int, max_ngram: int) -> list[int]:
    """The tokens that followed an earlier occurrence of the last n-gram of ``ids``, trying n = max_ngram down to
    1; [] when no n-gram recurs. Of the occurrences of that n-gram, the latest one followed by ``k`` tokens wins
    (recent text is the likeliest to repeat); when none is, the one followed by the most tokens (the latest of
    equals) — a match near the end has a clipped continuation, and a short draft wastes the verification pass."""
    if k <= 0:
        return []
    for n in range(min(max_ngram, len(ids) - 1), 0, -1):
        suffix = ids[-n:]
        best: list[int] = []
        # Latest first; the suffix itself (ending at the last token) has no continuation.
        for start in range(len(ids) - n - 1, -1, -1):
            if ids[start : start + n] == suffix:
                continuation = ids[start + n : start + n + k]
                if len(continuation) > len(best):
                    best = continuation
                    if len(best) == k:
                        break
        if best:
            return best
    return []


class ModelDrafter(Drafter):
    """Autoregressive drafting with a causal LM (a separate small model, or the target's first layers)."""

    deterministic = False

    def __init__(self, model: nn.Module, pipeline: tuple[NamedTransform, ...], sample: bool,
                 generator: torch.Generator, device: torch.device) -> None:
        self.model = model
        self.pipeline = pipeline
        self.sample = sample
        self.generator = generator
        self.device = device
        self.cache = DynamicCache(config=model.config)
        keep_past(self.cache)
        self._last_logits: torch.Tensor | None = None  # after the cache's last position, if still valid

    def propose(self, ids: list[int], k: int) -> Draft:
        tokens, rows = [], []
        context = torch.tensor([ids], device=self.device)  # [1, n]
        cached = self.cache.get_seq_length()
        for _ in range(k):
            feed = context[:, cached:]  # what the drafter has not read yet
            logits = self.model(input_ids=feed, cache=self.cache, use_cache=True).logits[:, -1, :].float()
            processed = run_pipeline(self.pipeline, context, logits)  # [1, vocab]
            probs = processed.softmax(dim=-1)
            if self.sample:
                token = int(torch.multinomial(probs, 1, generator=self.generator).item())
            else:
                token = int(processed.argmax(dim=-1).item())
            tokens.append(token)
            rows.append(probs[0])
            cached = context.shape[1]
            context = torch.cat([context, context.new_tensor([[token]])], dim=1)
        return Draft(tokens, torch.stack(rows) if rows else None)

    def after_round(self, kept: int, target_choices: list[int], accepted: int) -> None:
        roll_back(self.cache, kept)


class LayersDrafter(ModelDrafter):
    name = "layers"


class SmallModelDrafter(ModelDrafter):
    name = "model"


class QuantizedDrafter(ModelDrafter):
    name = "quantized"


class JacobiDrafter(Drafter):
    name = "jacobi"
    detail = "the target's own predictions for the guessed positions, refined each pass"

    def __init__(self) -> None:
        self.guess: list[int] = []

    def propose(self, ids: list[int], k: int) -> Draft:
        # First round: the last k tokens of the text as the initial guess (any guess converges).
        guess = self.guess or ids[-k:]
        guess = (guess + [guess[-1]] * k)[:k] if guess else []
        return Draft(guess, None)

    def after_round(self, kept: int, target_choices: list[int], accepted: int) -> None:
        # choices[accepted] is the target's own next token; the positions after it were predicted from the
        # guess: they are the next guess (one Jacobi update).
        self.guess = target_choices[accepted + 1 :]
