"""Attention events: what each new token looked at, recorded during the real decode (``--record-attention``).

``AttentionStarted`` comes once, after ``kv_start``: the geometry and the prompt's token texts (the position axis
is the prompt and then the output). One ``AttentionRow`` comes right before each ``token`` event (same ``step``):
the attention row of the query that produced that token (step 0: the prompt's last position) in every layer and
head, over the positions that layer holds. Compact: per layer and head the ``top`` largest weights with their
absolute positions, and the mass of the rest (0 when everything is kept).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True)
class AttentionStarted:
    type: ClassVar[str] = "attention_start"
    layers: int
    heads: int  # query heads (the rows recorded)
    kv_heads: int
    top: int  # positions kept per layer and head (0: every position)
    prompt_tokens: tuple[str, ...]  # the text of each prompt position


@dataclass(frozen=True)
class AttentionRow:
    type: ClassVar[str] = "attention"
    step: int  # the step of the ``token`` event that follows
    query_position: int  # the position whose query this row is (prompt length + step − 1)
    positions: tuple[tuple[tuple[int, ...], ...], ...]  # [layer][head] -> absolute positions, largest weight first
    weights: tuple[tuple[tuple[float, ...], ...], ...]  # [layer][head] -> their weights (softmax probabilities)
    rest: tuple[tuple[float, ...], ...]  # [layer][head] -> the mass of the positions not listed
    held: tuple[int, ...]  # [layer] keys the layer's attention read
