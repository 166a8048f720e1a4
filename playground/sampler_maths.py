"""The samplers' maths that needs no torch, written once for the engine and the what-if (``state.what_if``): DRY's
match lengths, the n-gram ban's index, mirostat's and Adaptive-P's state updates. Plain Python on token ids and
floats; it sits in the bottom layer so that the engine and the folds may both import it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

# An n-gram ban's own changes are merged into a new shared index past this many keys (a fork copies at most these).
NGRAM_DELTA = 32

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


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the longest common prefix of two token lists (slice comparisons: C speed)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class NgramBan:
    """transformers' ``no_repeat_ngram_size`` (``NoRepeatNGramLogitsProcessor``) over one text that grows and
    shrinks at its end: every n-gram window of the text (prompt included) whose first n-1 tokens are the text's
    last n-1 bans its last token. The windows are indexed as the text grows (``extend``, one window per token) and
    dropped as it shrinks (``truncate``, latest first), so a decode step costs one window, not a rescan.

    The index: a ``base`` that is never changed once made (forks share it) and this ban's own recent changes
    (``delta``, at most ``NGRAM_DELTA`` keys, then merged into a new base): ``fork`` copies only the changes."""

    def __init__(self, n: int, tokens: Sequence[int] = ()) -> None:
        if n < 1:
            raise ValueError(f"an n-gram ban needs n >= 1 (got {n})")
        self.n = n
        self.tokens: list[int] = []
        # (n-1)-gram -> the tokens that followed it, in text order (an empty list in delta: none any more)
        self.base: dict[tuple[int, ...], tuple[int, ...]] = {}
        self.delta: dict[tuple[int, ...], list[int]] = {}
        self.extend(tokens)

    def _own(self, key: tuple[int, ...]) -> list[int]:
        after = self.delta.get(key)
        if after is None:
            after = self.delta[key] = list(self.base.get(key, ()))
        return after

    def _merge(self) -> None:
        base = dict(self.base)  # a new one: the old may be shared with forks
        for key, after in self.delta.items():
            if after:
                base[key] = tuple(after)
            else:
                base.pop(key, None)
        self.base, self.delta = base, {}

    def _key(self, start: int) -> tuple[int, ...]:
        return tuple(self.tokens[start:start + self.n - 1])

    def extend(self, tokens: Sequence[int]) -> None:
        """The text continues with ``tokens``."""
        text, n = self.tokens, self.n
        for token in tokens:
            text.append(token)
            if len(text) >= n:
                self._own(self._key(len(text) - n)).append(token)
                if len(self.delta) > NGRAM_DELTA:
                    self._merge()

    def truncate(self, length: int) -> None:
        """The text is cut back to its first ``length`` tokens."""
        text, n = self.tokens, self.n
        while len(text) > max(length, 0):
            if len(text) >= n:
                self._own(self._key(len(text) - n)).pop()  # the latest window of this key is the text's last
            text.pop()

    def follow(self, tokens: Sequence[int]) -> None:
        """Make the text ``tokens``: cut back to the common prefix, then extend."""
        keep = common_prefix(self.tokens, tokens)
        self.truncate(keep)
        self.extend(tokens[keep:])

    def follow_from(self, start: int, tail: Sequence[int]) -> None:
        """Make the text its first ``start`` tokens (known to be right) followed by ``tail``."""
        keep = start + common_prefix(self.tokens[start:], tail)
        self.truncate(keep)
        self.extend(tail[keep - start:])

    def banned(self) -> set[int]:
        """The tokens banned after the whole text."""
        if len(self.tokens) < self.n - 1:
            return set()
        key = self._key(len(self.tokens) - self.n + 1)
        after = self.delta.get(key)
        return set(after if after is not None else self.base.get(key, ()))

    def fork(self) -> NgramBan:
        """An independent copy: the base shared, the recent changes copied."""
        twin = NgramBan.__new__(NgramBan)
        twin.n, twin.tokens, twin.base = self.n, list(self.tokens), self.base
        twin.delta = {key: list(after) for key, after in self.delta.items()}
        return twin


class NgramBans:
    """The n-gram bans of a batch of texts from call to call (the engine's sampler): each text continues the ban
    of a text it extends from the last call (a decode step's one more token, a beam's parent, a speculative
    context's shorter prefix), forked where two texts continue the same one; a text that extends none follows the
    closest (cut back to the common prefix). The result is always the ban of each text as given."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.held: list[NgramBan] = []

    def banned(self, rows: Sequence[Sequence[int]]) -> list[set[int]]:
        """Each text's banned tokens (``rows``: the texts, prompt included)."""
        rows = [row if isinstance(row, list) else list(row) for row in rows]  # (a tuple never equals a list)
        held, claimed = self.held, [False] * len(self.held)
        chosen: list[NgramBan | None] = [None] * len(rows)
        for r, row in enumerate(rows):  # first the texts that extend a held one (the usual case)
            for k, ban in enumerate(held):
                m = len(ban.tokens)
                if m <= len(row) and row[:m] == ban.tokens:
                    chosen[r] = ban.fork() if claimed[k] else ban
                    claimed[k] = True
                    break
        out: list[set[int]] = []
        made: list[NgramBan] = []
        for r, row in enumerate(rows):
            found = chosen[r]
            if found is not None:
                found.extend(row[len(found.tokens):])
            else:  # extends none: from the text sharing the longest prefix (held, or made for an earlier row)
                options = [(common_prefix(ban.tokens, row), k) for k, ban in enumerate(held)]
                options += [(common_prefix(ban.tokens, row), -1 - k) for k, ban in enumerate(made)]
                shared, k = max(options, default=(0, 0))
                if shared == 0:
                    found = NgramBan(self.n)
                elif k < 0:
                    found = made[-1 - k].fork()
                else:
                    found = held[k].fork() if claimed[k] else held[k]
                    claimed[k] = True
                found.follow(row)
                made.append(found)
                chosen[r] = found
            out.append(found.banned())
        self.held = [ban for ban in chosen if ban is not None]
        return out

    def continued(self, parents: Sequence[int], start: int, tails: Sequence[Sequence[int]]) -> list[set[int]]:
        """Each text's banned tokens, text ``r`` being the first ``start`` tokens of ``held[parents[r]]`` (the
        caller has checked them) followed by ``tails[r]``: a step of beams, each continuing one of the last."""
        held, claimed, chosen = self.held, [False] * len(self.held), []
        for parent, tail in zip(parents, tails, strict=True):
            ban = held[parent].fork() if claimed[parent] else held[parent]
            claimed[parent] = True
            ban.follow_from(start, tail)
            chosen.append(ban)
        self.held = chosen
        return [ban.banned() for ban in chosen]

    def accept(self, token: int) -> None:
        """A single text took ``token``: extend it now (the next call then finds it already indexed)."""
        if len(self.held) == 1:
            self.held[0].extend((token,))

    def reset(self) -> None:
        self.held = []


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
