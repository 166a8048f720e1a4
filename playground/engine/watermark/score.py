"""Scoring a text with a loaded model's tokenizer (and, for SWEET, its entropies), and the edit-budget experiment:
the score after replacing every k-th word or deleting a span, to see how much editing the watermark survives.

A text is scored as its token ids without special tokens (as the output of a run is); SWEET's entropies come
from one teacher-forced pass over the text after the model's BOS (or its first token unscored where it has none),
the model's entropy where each token was predicted (bits).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from playground.config.samplers.watermark import WatermarkSettings
from playground.watermarking import GreenLists, SynthID, kirchenbauer_key, synthid_key
from playground.watermarking.detect import Detection, DetectionError, detect_kirchenbauer, detect_synthid

# Words an edit puts in place of the text's own (a plain stand-in for a person's rewording).
REPLACEMENTS = ("the", "a", "very", "quite", "then", "and", "so", "it", "this", "one", "some", "just", "also",
                "really", "now", "still", "there", "here", "well", "much", "often", "later", "again", "even")
REPLACE_EVERY = (0, 12, 8, 6, 5, 4, 3, 2, 1)  # 0: the text as it is
DELETE_SHARES = (0.1, 0.25, 0.5)


def encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def text_entropies(lm: Any, ids: Sequence[int]) -> list[float]:
    """The model's entropy (bits) where each of ``ids`` was predicted (``inf`` for a first token without BOS)."""
    bos = lm.tokenizer.bos_token_id
    context = ([bos] if bos is not None else []) + list(ids)
    with torch.inference_mode():
        logits = lm.model(torch.tensor([context], device=lm.device)).logits[0].float()
    logp = logits.log_softmax(-1)
    bits = (torch.special.entr(logp.exp()).sum(-1) / math.log(2)).tolist()
    return bits[: len(ids)] if bos is not None else [math.inf, *bits[: len(ids) - 1]]


def detect_ids(g: WatermarkSettings, ids: Sequence[int], vocab_size: int, *, entropies: Sequence[float] | None = None,
               eos_id: int | None = None) -> Detection:
    """The detector for ``g``'s scheme and key on ``ids``."""
    if g.watermark == "synthid":
        return detect_synthid(SynthID(synthid_key(g)), ids, vocab_size, threshold=g.z_threshold, eos_id=eos_id,
                              entropies=entropies, entropy_threshold=g.entropy_threshold)
    if g.watermark != "kirchenbauer":
        raise DetectionError("choose a watermark to detect: --watermark kirchenbauer or synthid")
    return detect_kirchenbauer(GreenLists.of(kirchenbauer_key(g, vocab_size)), ids, threshold=g.z_threshold,
                               ignore_repeated_ngrams=g.ignore_repeated_ngrams, entropies=entropies,
                               entropy_threshold=g.entropy_threshold)


def detect_text(lm: Any, g: WatermarkSettings, text: str) -> Detection:
    ids = encode(lm.tokenizer, text)
    entropies = text_entropies(lm, ids) if g.entropy_threshold > 0 and ids else None
    return detect_ids(g, ids, lm.vocab_size, entropies=entropies)


def replace_every(text: str, k: int, seed: int = 0) -> tuple[str, int]:
    """Every k-th word replaced by a common word (k = 0: none): the text and how many words changed."""
    words = text.split(" ")
    if k <= 0:
        return text, 0
    rng = random.Random(seed)
    changed = 0
    for i in range(k - 1, len(words), k):
        if words[i].strip():
            words[i] = rng.choice([w for w in REPLACEMENTS if w != words[i]])
            changed += 1
    return " ".join(words), changed


def delete_span(text: str, share: float) -> tuple[str, int]:
    """The middle ``share`` of the words deleted: the text and how many words went."""
    words = text.split(" ")
    n = round(len(words) * share)
    start = (len(words) - n) // 2
    return " ".join(words[:start] + words[start + n:]), n


@dataclass(frozen=True)
class EditRow:
    edit: str
    words_changed: int
    words: int
    z_score: float
    p_value: float
    scored: int
    detected: bool

    def as_dict(self) -> dict[str, Any]:
        return {"edit": self.edit, "words_changed": self.words_changed, "words": self.words,
                "share_changed": round(self.words_changed / max(self.words, 1), 4),
                "z_score": round(self.z_score, 4), "p_value": self.p_value, "scored": self.scored,
                "detected": self.detected}


def edit_budget(lm: Any, g: WatermarkSettings, text: str, seed: int = 0) -> list[EditRow]:
    """The score after each edit of ``text`` (replace every k-th word for k in ``REPLACE_EVERY``, then delete the
    middle share of the words for each of ``DELETE_SHARES``)."""
    words = len(text.split(" "))
    rows = []
    edits: list[tuple[str, tuple[str, int]]] = [
        (f"replace 1 word in {k}" if k else "as generated", replace_every(text, k, seed)) for k in REPLACE_EVERY]
    edits += [(f"delete the middle {share:.0%}", delete_span(text, share)) for share in DELETE_SHARES]
    for name, (edited, changed) in edits:
        try:
            d = detect_text(lm, g, edited)
        except DetectionError:
            continue
        rows.append(EditRow(name, changed, words, d.z_score, d.p_value, d.scored, d.prediction))
    return rows
