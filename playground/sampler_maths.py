"""The samplers' maths that needs no torch, written once for the engine and the what-if (``state.what_if``): DRY's
match lengths, the n-gram ban's index, mirostat's and Adaptive-P's state updates. Plain Python on token ids and
floats; it sits in the bottom layer so that the engine and the folds may both import it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

# A DRY match longer than this is counted as this long (text-generation-webui's cap; it also bounds base**length).
DRY_MAX_MATCH = 50


def dry_match_lengths(tokens: Sequence[int], breakers: frozenset[int], end: int | None = None,
                      positions: dict[int, list[int]] | None = None) -> dict[int, int]:
    """For each token that would continue an earlier occurrence of the text's ending: the longest such ending.

    The text ``a b c ... a b`` ends with ``a b``, which was followed by ``c`` before: emitting ``c`` would extend a
    repeat of length 2. A repeat never extends across a sequence breaker, and a breaker is never penalised.
    ``end``: the index of the text's last token (default: the last of ``tokens``; the what-if walks one context
    step by step); ``positions``: where each token occurs in ``tokens`` (ascending), when the caller keeps it.
    """
    lengths: dict[int, int] = {}
    end = len(tokens) - 1 if end is None else end
    if end < 0 or tokens[end] in breakers:
        return lengths
    last = tokens[end]
    earlier = positions.get(last, ()) if positions is not None else range(end)
    for i in earlier:  # every earlier occurrence of the last token (the last one itself always matches)
        if i >= end:
            break
        if tokens[i] != last:
            continue
        following = tokens[i + 1]
        if following in breakers:
            continue
        length = 1
        while length < DRY_MAX_MATCH and i - length >= 0:
            behind = tokens[end - length]
            if tokens[i - length] != behind or behind in breakers:
                break
            length += 1
        lengths[following] = max(length, lengths.get(following, 0))
    return lengths


def dry_penalty(length: int, multiplier: float, base: float, allowed_length: int) -> float:
    """DRY's penalty for extending a repeat of ``length >= allowed_length`` tokens."""
    return multiplier * base ** (length - allowed_length)


class NgramIndex:
    """The no-repeat n-gram ban over a growing text: every n-gram window whose first n-1 tokens equal the text's
    last n-1 bans its last token (transformers' ``NoRepeatNGramLogitsProcessor``)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.following: dict[tuple[int, ...], set[int]] = {}
        self.indexed = 0  # windows tokens[i:i + n] with i < indexed are in ``following``

    def banned(self, tokens: Sequence[int], length: int) -> set[int]:
        """The tokens banned after ``tokens[:length]`` (call with growing lengths of the same text)."""
        n = self.n
        while self.indexed <= length - n:
            i = self.indexed
            self.following.setdefault(tuple(tokens[i:i + n - 1]), set()).add(tokens[i + n - 1])
            self.indexed += 1
        if length < n:
            return set()
        return set(self.following.get(tuple(tokens[length - n + 1:length]), ()))


def mirostat_next_mu(mu: float, prob: float, tau: float, eta: float) -> float:
    """Mirostat v2's mu after a token of probability ``prob`` (under the distribution it was drawn from) was
    chosen: moved by the error between its surprise and tau. A token the chain had removed (prob 0) teaches
    nothing."""
    return mu - eta * (-math.log2(prob) - tau) if prob > 0.0 else mu


# Adaptive-P (llama.cpp's ``llama_sampler_adaptive_p``): its transform's constants, as llama.cpp defines them.
ADAPTIVE_WIDTH, ADAPTIVE_PEAK, ADAPTIVE_SHARPNESS = 0.3, 5.0, 10.0


def adaptive_start(target: float, decay: float) -> tuple[float, float]:
    """The moving average's (weighted sum, total weight) at the start: target/(1 − decay) and 1/(1 − decay)."""
    decay = min(max(decay, 0.0), 0.99)
    return target / (1.0 - decay), 1.0 / (1.0 - decay)


def adaptive_target(target: float, weighted_sum: float, total_weight: float) -> float:
    """This step's adapted target: 2·target − the average of the chosen tokens' probabilities, in [0, 1]."""
    clamped = min(max(target, 0.0), 1.0)
    adapted = clamped if total_weight == 0.0 else 2.0 * clamped - weighted_sum / total_weight
    return min(max(adapted, 0.0), 1.0)


def adaptive_accept(weighted_sum: float, total_weight: float, prob: float, decay: float) -> tuple[float, float]:
    """The average after a token whose probability before the transform was ``prob``."""
    decay = min(max(decay, 0.0), 0.99)
    return prob + decay * weighted_sum, 1.0 + decay * total_weight
