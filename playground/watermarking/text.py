"""A text scored by its settings' watermark, and the edits of the edit budget (pure maths on token ids, no model).

A text is scored as its token ids without special tokens (as the output of a run is). The edit budget scores a
text again after replacing every k-th word with a common one or deleting the middle of it, to see how much
editing the watermark survives. The model's part (SWEET's entropies, one pass of the loaded model over the text)
is the engine's (``playground.engine.watermark.score``); the window reaches it through its model source.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

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
