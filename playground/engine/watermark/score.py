"""Scoring a text with a loaded model (its tokenizer and, for SWEET, its entropies), and the edit-budget experiment
on it (``playground watermark-detect``). The scoring and the edits themselves are pure maths on token ids, in
``playground.watermarking.text``; the model's part is here: SWEET's entropies come from one teacher-forced pass over
the text after the model's BOS (or its first token unscored where it has none), the model's entropy where each
token was predicted (bits).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from playground.config.samplers.watermark import WatermarkSettings
from playground.watermarking.detect import Detection, DetectionError
from playground.watermarking.text import DELETE_SHARES, REPLACE_EVERY, delete_span, detect_ids, encode, replace_every


def text_entropies(lm: Any, ids: Sequence[int]) -> list[float]:
    """The model's entropy (bits) where each of ``ids`` was predicted (``inf`` for a first token without BOS)."""
    bos = lm.tokenizer.bos_token_id
    context = ([bos] if bos is not None else []) + list(ids)
    with torch.inference_mode():
        logits = lm.model(torch.tensor([context], device=lm.device)).logits[0].float()
    logp = logits.log_softmax(-1)
    bits = (torch.special.entr(logp.exp()).sum(-1) / math.log(2)).tolist()
    return bits[: len(ids)] if bos is not None else [math.inf, *bits[: len(ids) - 1]]


def detect_text(lm: Any, g: WatermarkSettings, text: str) -> Detection:
    ids = encode(lm.tokenizer, text)
    entropies = text_entropies(lm, ids) if g.entropy_threshold > 0 and ids else None
    return detect_ids(g, ids, lm.vocab_size, entropies=entropies)


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
