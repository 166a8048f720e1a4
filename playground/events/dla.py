"""Direct logit attribution events: why the model chose token A over B at one step, split over what wrote to the
residual stream (``playground.engine.dla.attribute`` says how).

A run asked to attribute (``--attribute-steps``, or the window's Attribute button) gets one ``LogitAttribution`` per
attributed step, after its tokens; a saved run keeps them, so the view reopens without the model. Layers are
numbered from 1 in the views; index i of each per-layer tuple is layer i + 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

LINEARISATION = ("final norm's scale frozen at its value for this position (the standard linearisation; Gemma's "
                 "post-norms too): the components plus the frozen norm's bias term sum to the logit difference "
                 "before soft-capping")


@dataclass(frozen=True)
class LogitAttribution:
    """The logit difference of ``token_id`` over ``against_id`` at one step, by component (logit units)."""

    type: ClassVar[str] = "dla"
    step: int  # the step whose token is explained
    position: int  # its position in the sequence (the prompt's last token is the first step's)
    token_id: int
    token_text: str
    against_id: int
    against_text: str
    difference: float  # the model's own logit difference, before soft-capping
    capped_difference: float  # after the model's logit transform (= difference without soft-capping)
    softcap: float | None
    embeddings: float  # token (and position) embeddings
    attention: tuple[float, ...]  # per layer: the attention block's write (heads + output bias)
    heads: tuple[tuple[float, ...], ...]  # per layer, per head
    attention_bias: tuple[float, ...]  # per layer: the output projection's bias
    mlp: tuple[float, ...]  # per layer
    other: tuple[float, ...]  # per layer: what else the layer added (a steering vector's hook); 0 without one
    norm_bias: float  # the frozen norm's bias term (LayerNorm's b, the LM head's bias)
    running: tuple[float, ...]  # after each layer: embeddings + bias term + every component up to it
    lens: tuple[float, ...]  # the logit lens's difference at each layer's output (its own norm scale)
    family: str
    linearisation: str

    @property
    def components_sum(self) -> float:
        return self.embeddings + self.norm_bias + sum(self.attention) + sum(self.mlp) + sum(self.other)


@dataclass(frozen=True)
class AttributionMissing:
    """An attribution that was asked for and could not be made (the word was not emitted, ...), in words."""

    type: ClassVar[str] = "dla_missing"
    what: str
