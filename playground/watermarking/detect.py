"""Detecting a watermark in any token ids: per token, whether it counts and its colour (green / red, SynthID's
g-values), and the score.

Green lists: transformers' ``WatermarkDetector`` (the leading BOS dropped, the first ``context_width`` tokens, or
``context_width − 1`` for selfhash, only seed, ``ignore_repeated_ngrams`` counts each n-gram once), z =
(green − γ·n) / √(n·γ(1 − γ)) and the one-sided p-value ½·erfc(z/√2). SynthID: the mean g-value over the scored
tokens (the first ``ngram_len − 1`` only seed; repeated contexts and everything from the first EOS on are masked,
as transformers' detector masks them); its Bayesian detector needs training, so the score is read as a z-score
against unwatermarked text, whose g-values are fair coins: z = (mean − ½) / √(1 / (4·n·depth)).
SWEET (Lee et al. 2023): only the tokens whose entropy under the model is at least a threshold are scored (the
entropies are the caller's, from one teacher-forced pass).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from playground.errors import UserError
from playground.watermarking.kirchenbauer import GreenLists
from playground.watermarking.synthid import SynthID


class DetectionError(UserError, ValueError):
    """A text the detector cannot score (too short, another tokenizer's ids); the message says why."""


@dataclass(frozen=True)
class Detection:
    """A text's score. ``colours[i]``: token i's colour (1 green, 0 red; SynthID: its mean g-value over the
    layers), None where it is not scored; ``scored``: how many count."""

    colours: tuple[float | None, ...]
    scored: int
    green: float  # green tokens counted (SynthID: the sum of the mean g-values)
    z_score: float
    p_value: float
    threshold: float

    @property
    def prediction(self) -> bool:
        return self.z_score > self.threshold

    @property
    def green_fraction(self) -> float:
        return self.green / self.scored if self.scored else math.nan

    @property
    def verdict(self) -> str:
        return "watermarked" if self.prediction else "not watermarked"


def p_value(z: float) -> float:
    """The one-sided p-value of ``z`` under the standard normal (transformers' ``_compute_pval``)."""
    return 0.5 * math.erfc(z / math.sqrt(2))


def z_of(green: float, n: int, gamma: float) -> float:
    return (green - gamma * n) / math.sqrt(n * gamma * (1 - gamma)) if n else math.nan


def _check_ids(ids: Sequence[int], vocab_size: int) -> None:
    high = max(ids, default=0)
    if high >= vocab_size or min(ids, default=0) < 0:
        raise DetectionError(f"token id {high} is outside this vocabulary of {vocab_size}: the text was tokenized "
                             "with another tokenizer; detect it with the model it was generated with")


def detect_kirchenbauer(lists: GreenLists, ids: Sequence[int], *, threshold: float = 4.0, bos_id: int | None = None,
                        ignore_repeated_ngrams: bool = False, entropies: Sequence[float] | None = None,
                        entropy_threshold: float = 0.0) -> Detection:
    """``ids``: the text's token ids (a prompt left out: it would be scored too). ``entropies[i]``: the model's
    entropy (bits) where token i was predicted, for SWEET (``entropy_threshold`` > 0)."""
    key = lists.key
    ids = list(ids)
    _check_ids(ids, key.vocab_size)
    offset = 1 if ids and bos_id is not None and ids[0] == bos_id else 0
    ids = ids[offset:]
    n = key.context_width + 1 - int(key.selfhash)  # the n-gram: its prefix seeds, its last token is scored
    if len(ids) - key.context_width < 1:
        raise DetectionError(f"the text is too short to score: {len(ids)} token(s), and the first "
                             f"{key.context_width} only seed the green lists ({key.seeding_scheme}, context width "
                             f"{key.context_width}); write at least {key.context_width + 1}")
    colours: list[float | None] = [None] * (offset + len(ids))
    seen: Counter[tuple[int, ...]] = Counter()
    greens: dict[tuple[int, ...], bool] = {}
    for end in range(n - 1, len(ids)):
        if entropies is not None and entropy_threshold > 0 and entropies[offset + end] < entropy_threshold:
            continue
        ngram = tuple(ids[end - n + 1: end + 1])
        if ngram not in greens:
            greens[ngram] = lists.is_green(ngram[:-1], ngram[-1])  # (selfhash completes the window itself)
        seen[ngram] += 1
        colours[offset + end] = 1.0 if greens[ngram] else 0.0
    if ignore_repeated_ngrams:
        scored, green = len(seen), float(sum(greens[g] for g in seen))
    else:
        scored, green = sum(seen.values()), float(sum(greens[g] * c for g, c in seen.items()))
    if scored == 0:
        raise DetectionError(f"no token is left to score: SWEET's entropy threshold {entropy_threshold:g} bits "
                             "keeps none of this text's tokens; lower it")
    z = z_of(green, scored, key.greenlist_ratio)
    return Detection(tuple(colours), scored, green, z, p_value(z), threshold)


def synthid_mask(wm: SynthID, ids: torch.Tensor, eos_id: int | None) -> torch.Tensor:
    """transformers' detector mask [1, n − (ngram_len − 1)]: fresh contexts, before the first EOS."""
    fresh = wm.repetition_mask(ids)
    if eos_id is not None:
        hit = (ids[0] == eos_id).nonzero()
        noneos = torch.ones(ids.shape[1], dtype=torch.bool)
        if hit.shape[0]:
            noneos[int(hit[0, 0]):] = False
        fresh = fresh & noneos[wm.key.ngram_len - 1:][None]
    return fresh


def detect_synthid(wm: SynthID, ids: Sequence[int], vocab_size: int, *, threshold: float = 4.0,
                   eos_id: int | None = None, entropies: Sequence[float] | None = None,
                   entropy_threshold: float = 0.0) -> Detection:
    ids = list(ids)
    _check_ids(ids, vocab_size)
    width = wm.key.ngram_len - 1
    if len(ids) <= width:
        raise DetectionError(f"the text is too short to score: {len(ids)} token(s), and SynthID's first "
                             f"{width} (ngram_len − 1) only seed; write at least {width + 1}")
    tensor = torch.tensor([ids], dtype=torch.long)
    g = wm.g_values(tensor)[0].double()  # [m, depth]
    mask = synthid_mask(wm, tensor, eos_id)[0]
    if entropies is not None and entropy_threshold > 0:
        mask = mask & (torch.tensor(list(entropies[width:]), dtype=torch.double) >= entropy_threshold)
    colours: list[float | None] = [None] * len(ids)
    means = g.mean(dim=1).tolist()
    for j, keep in enumerate(mask.tolist()):
        if keep:
            colours[width + j] = means[j]
    scored = int(mask.sum())
    if scored == 0:
        raise DetectionError("no token is left to score: every context repeats, an EOS comes first, or SWEET's "
                             "entropy threshold keeps none; use a longer text or lower the threshold")
    total = float(g[mask].mean(dim=1).sum())
    mean = total / scored
    z = (mean - 0.5) / math.sqrt(1.0 / (4 * scored * wm.key.depth))
    return Detection(tuple(colours), scored, total, z, p_value(z), threshold)
