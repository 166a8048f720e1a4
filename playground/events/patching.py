"""Activation patching (causal tracing) between a clean and a corrupted prompt of the same length.

The clean run's activation at one layer and one position is put into the corrupted run; the map holds the share
of the logit difference it brings back, (patched − corrupted) / (clean − corrupted), where the difference is
logit(answer) − logit(foil) at the last position. Three maps: the residual stream entering each decoder block
(TransformerLens's ``resid_pre``: block 0's is the embeddings), each block's attention output and each block's
MLP output (both before the residual add). One ``PatchingRow`` per map and layer, in the order they are computed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

PATCH_MAPS = ("residual", "attention", "mlp")
MAP_TITLES = {"residual": "residual stream", "attention": "attention output",
              "mlp": "MLP output"}


@dataclass(frozen=True)
class PatchingStarted:
    type: ClassVar[str] = "patching_start"
    clean_tokens: tuple[str, ...]
    corrupted_tokens: tuple[str, ...]
    clean_ids: tuple[int, ...]
    corrupted_ids: tuple[int, ...]
    layers: int
    maps: tuple[str, ...]  # of PATCH_MAPS, in the order they come
    answer_id: int
    answer_text: str
    foil_id: int
    foil_text: str
    clean_diff: float  # logit(answer) − logit(foil), clean prompt
    corrupted_diff: float  # the same, corrupted prompt
    differ: tuple[int, ...]  # the positions where the two prompts' tokens differ


@dataclass(frozen=True)
class PatchingRow:
    """One layer of one map: the recovered share at every position (the step is the row's index in the run)."""

    type: ClassVar[str] = "patching_row"
    step: int
    map: str
    layer: int  # 0-based decoder block
    recovered: tuple[float, ...]  # per position
    seconds: float  # this row's compute time
