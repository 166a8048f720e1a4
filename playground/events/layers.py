"""Layer-wise events: the logit lens (every layer's next-token distribution), early exit, layer skipping.

A run recorded with the lens, or an early-exit / layer-skip run, yields one ``LayerStep`` right before each
``token`` event (same ``step``); the token event still carries everything a plain step carries. Layers are
numbered from 1 (the first decoder layer) to ``layers`` (the last); index i of every per-layer tuple is layer i + 1.
A layer that did not run for a token (after its early exit, or skipped) has None in the per-layer figures.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True)
class LayersStarted:
    """Right after ``start``: what the run does with its layers, described once for the view."""

    type: ClassVar[str] = "layers_start"
    mode: str  # "lens" (every layer runs) | "early-exit" | "layer-skip"
    layers: int  # decoder layers of the model
    lens_top: int  # candidates recorded per layer
    exit_metric: str  # "entropy" | "max-prob"
    exit_threshold: float  # bits (entropy, at most) or probability (max-prob, at least)
    min_exit_layer: int  # 1-based
    skip_layers: tuple[int, ...]  # 1-based layers always skipped (layer-skip)
    skip_threshold: float  # layer-skip's dynamic rule: skip after a relative residual update below this (0: off)
    kv_fill: str  # how keys and values of layers that did not run are filled, in words
    lens_kind: str = "logit"  # "logit" | "tuned": which lens the layers' figures come from


@dataclass(frozen=True)
class LensCandidate:
    token_id: int
    text: str
    prob: float  # softmax of that layer's lens logits


@dataclass(frozen=True)
class LayerStep:
    """One token's pass through the layers: what each layer would have said, and which layers ran."""

    type: ClassVar[str] = "layers"
    step: int  # the step of the ``token`` event that follows
    layer_entropy: tuple[float | None, ...]  # bits of each layer's lens distribution, first layer first
    layer_top_prob: tuple[float | None, ...]  # probability of each layer's top token
    layer_top: tuple[tuple[LensCandidate, ...], ...]  # each layer's top candidates (empty: it did not run)
    agrees_with_final: tuple[bool | None, ...]  # each layer's top token equals the answering layer's
    residual_update: tuple[float | None, ...]  # ‖h_out − h_in‖ / ‖h_in‖ of each layer that ran
    exit_layer: int | None  # early exit: the layer that answered (1-based); None: the last layer answered
    skipped: tuple[int, ...]  # 1-based layers skipped for this token
    layers_computed: int  # layers that ran for this token
    layers_total: int
    lens_ms: float  # time spent on the lens (norm + LM head of the layers, and the statistics)
    forward_ms: float  # time of the token's pass through the layers (with exit checks and KV fills)
    # KL(p_last layer || p_layer) in nats of each layer under the logit lens and the tuned lens (empty: not known,
    # e.g. no tuned lens trained, or the last layer did not run); the step's other figures use ``lens_kind``'s
    kl_logit: tuple[float | None, ...] = ()
    kl_tuned: tuple[float | None, ...] = ()
    lens_kind: str = "logit"
