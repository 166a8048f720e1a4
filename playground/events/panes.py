"""Side-by-side runs: several configurations decoding the same prompt, streaming together in aligned panes.

Used by the quantization lab (the reference and the quantized copy) and by the strategies comparison (2-4 of any
strategies and settings). A compare run yields its own ``start`` (the first pane's settings), then ``PaneStarted``
for every pane, then the panes' tokens interleaved step by step (``PaneToken``), ``PaneFinished`` for each pane as it
ends, and a ``done``. Pane 0 is the reference the others are compared with.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from playground.events.run import StopReason


@dataclass(frozen=True)
class PaneStarted:
    type: ClassVar[str] = "pane_start"
    pane: int  # 0 = the reference pane
    label: str  # short, for the pane's title ("reference float32", "rtn-int4 g128", "sample T=0.7")
    summary: str  # the pane's settings in one line
    strategy: str
    model_name: str


@dataclass(frozen=True)
class PaneToken:
    """A token one pane produced (beam panes have none until they finish: their text comes with ``PaneFinished``)."""

    type: ClassVar[str] = "pane_token"
    pane: int
    step: int  # 0 = the pane's first generated token
    token_id: int
    text: str  # incremental text this token adds to the pane's output
    prob: float  # the pane's probability of the token (after its sampler pipeline)
    step_ms: float


@dataclass(frozen=True)
class PaneFinished:
    """A pane's final output and the figures measured on it."""

    type: ClassVar[str] = "pane_done"
    pane: int
    token_ids: tuple[int, ...]
    text: str
    stop_reason: StopReason
    tokens_per_s: float
    decode_ms: float
    # Per-output figures by name: "log_likelihood" (under the reference model, nats), "tokens", "repeated_ngrams",
    # "distinct_1", "distinct_2", "first_divergence" (first step where it differs from pane 0; -1: never), ...
    figures: dict[str, float] = field(default_factory=dict)
