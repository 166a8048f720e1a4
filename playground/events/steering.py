"""Activation steering's events: what a steered run adds to the model, and what it did at each token.

A steered run (``--steer``, any strategy) yields ``SteeringStarted`` right after ``start`` (the vectors, the blocks
they steer, their norms), ``SteeringNorms`` before the first token's events (each steered block's mean residual
norm over the prompt, so a strength can be shown relative to it), and one ``SteerStep`` right before each kept
token's own event (same ``step``; a beam search: one per beam step, for its best row).

Blocks are numbered as the vector files number them: N is the 0-based decoder block whose output the direction is
added to (llama.cpp's ``direction.N``, transformers' ``hidden_states[N + 1]``). Index i of every per-layer tuple is
``SteeringStarted.layers[i]``; index v of every per-vector tuple is ``SteeringStarted.vectors[v]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True)
class SteeringVectorInfo:
    """One ``--steer`` vector as the run uses it."""

    name: str  # shown in views (the file's stem, or the name the file gives)
    source: str  # the file it was read from
    strength: float  # the settings' strength (a step's own are ``SteerStep.strengths``)
    layers: tuple[int, ...]  # the blocks N it steers in this run (its own, within --steer-layers)
    norms: tuple[float, ...]  # ‖direction‖ at each of those blocks (PCA directions are unit-norm; mean
    # differences are not)
    method: str  # "mean-diff", "pca", "actadd", or "" (a file that does not say, e.g. llama.cpp's)
    front: int = 0  # 0: added at every position; k: at the sequence's first k positions only (ActAdd)


@dataclass(frozen=True)
class SteeringStarted:
    """Right after ``start``: what the run adds to the model, described once for the views."""

    type: ClassVar[str] = "steer_start"
    vectors: tuple[SteeringVectorInfo, ...]
    layers: tuple[int, ...]  # every steered block N, ascending: the index of ``SteerStep``'s per-layer tuples
    model_layers: int  # decoder blocks of the model
    hidden_size: int
    compare: bool  # the steps carry the unsteered comparison (``--steer-compare``)
    live: bool  # the strength may change while the run streams (a slider holds it)
    # What is steered, in words: the target model; a drafter, amateur or cheap model that is another model is not
    target_only: str = ""


@dataclass(frozen=True)
class SteeringNorms:
    """Before the first token's events: each steered block's median residual norm over the prompt's positions after
    the first (its output before this block's own vector is added; earlier blocks' steering is in it). Position 0,
    the attention sink, has a norm many times the others' and is left out, unless the prompt is that one
    position. (Runs saved before this measured the mean over every prompt position.)"""

    type: ClassVar[str] = "steer_norms"
    layers: tuple[int, ...]  # as ``SteeringStarted.layers``
    residual_norms: tuple[float, ...]  # median ‖h_N‖ per block
    positions: int  # prompt positions the medians are over


@dataclass(frozen=True)
class SteerStep:
    """One kept token of a steered run: the strengths its pass used, the residual's reading, and (with
    ``--steer-compare``) what the unsteered model said of the same token."""

    type: ClassVar[str] = "steer"
    step: int  # the step of the event that follows (a ``token``; a beam step's)
    strengths: tuple[float, ...]  # per vector, the strength the pass that predicted this token used
    changed: bool  # the strengths differ from the previous step's (the live slider moved: the output marks it)
    # [vector][layer]: the residual at the position that predicted this token (the lens's position), block N's
    # output before its own vector is added, projected on vector v's unit direction at N; None where vector v has
    # no direction at block N
    projections: tuple[tuple[float | None, ...], ...]
    # With --steer-compare (else None): the chosen token's probability under the steered and the unsteered model's
    # raw distributions (before any sampler), and KL(steered ‖ unsteered) of the two, in nats
    steered_prob: float | None = None
    unsteered_prob: float | None = None
    kl: float | None = None
