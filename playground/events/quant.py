"""Quantization events: the quantized copy a run decodes with, and the lab's token-by-token comparison.

A run with ``--quant METHOD`` yields ``QuantReady`` right after ``start`` (what was built, its true size, how long it
took or that it came from the cache). With ``--compare`` it also yields, for every token of the reference pane, a
``QuantStep``: the reference's and the quantized model's next-token distributions on the same prefix (the reference's
tokens: teacher forcing), compared; and a ``QuantSummary`` before ``done``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar


@dataclass(frozen=True)
class LayerError:
    """How much quantization changed one linear layer's weights."""

    name: str  # e.g. "layers.3.mlp.down_proj"
    relative_error: float  # ‖W_q − W‖_F / ‖W‖_F


@dataclass(frozen=True)
class ChannelScales:
    """Per-input-channel figures of one linear layer, for the scales and outlier plots."""

    name: str  # the layer whose input they describe (e.g. "layers.3.mlp.down_proj")
    act_max_before: tuple[float, ...]  # max |x| per input channel on the calibration text, before smoothing
    act_max_after: tuple[float, ...]  # the same after dividing by the scales (equal to before for plain RTN)
    scales: tuple[float, ...]  # SmoothQuant's smoothing factors or AWQ's searched scales (empty for others)


@dataclass(frozen=True)
class QuantReady:
    type: ClassVar[str] = "quant_ready"
    method: str
    group_size: int | None  # None: per-channel
    stored: str  # how the weights are held: "int8 (per channel)", "packed int4", "packed int4 (AWQ-scaled)", ...
    reference_dtype: str  # the float model it was made from
    reference_weight_bytes: int
    weight_bytes: int  # what the quantized copy really holds
    seconds: float  # to build it (0 when it came from the cache)
    cached: bool
    note: str  # caveats in words (e.g. the default model's weights themselves come from a Q4_1 file)
    layer_errors: tuple[LayerError, ...] = ()
    channels: tuple[ChannelScales, ...] = ()  # a few representative layers, for the scales/outlier plots
    perplexity: dict[str, float] = field(default_factory=dict)  # on the evaluation text: "reference", method


@dataclass(frozen=True)
class QuantStep:
    """One reference token, scored by both models on the reference's prefix (teacher forcing)."""

    type: ClassVar[str] = "quant_step"
    step: int  # the reference pane's step
    token_id: int  # the reference's token at this step
    text: str
    kl: float  # KL(reference ‖ quantized) of the next-token distributions at this position, in nats
    reference_prob: float  # the reference's probability of its token
    quantized_prob: float  # the quantized model's probability of the same token
    quantized_top_id: int  # the quantized model's most likely token here
    quantized_top_text: str
    top1_agrees: bool  # the quantized model's top token equals the reference's top token


@dataclass(frozen=True)
class QuantSummary:
    type: ClassVar[str] = "quant_summary"
    kl_mean: float
    kl_median: float
    kl_p99: float
    kl_max: float
    top1_agreement: float
    tokens: int
    first_divergence: int  # first step where the free-running quantized output differs from the reference; -1 never
    reference_tokens_per_s: float
    quantized_tokens_per_s: float


@dataclass(frozen=True)
class MethodRow:
    """One method's figures, as measured by a comparison run on this model."""

    method: str  # "reference" or the method with its group / α ("rtn-int4 g128")
    weight_bytes: int
    stored: str
    perplexity: float | None  # on the evaluation text (None: not measured)
    tokens_per_s: float  # decoding speed in the comparison run
    kl_mean: float  # teacher-forced, over the run's tokens (0 for the reference)
    top1_agreement: float
    first_divergence: int  # -1: the free-running output never diverged


@dataclass(frozen=True)
class QuantTable:
    """Last before ``done`` in a comparison run: every method compared on this model so far in this process (the
    results are kept per model and method), this run's included."""

    type: ClassVar[str] = "quant_table"
    model_name: str
    rows: tuple[MethodRow, ...]
