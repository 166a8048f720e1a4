"""Quantization settings: which post-training method the model runs with (any strategy), and the lab's comparison.

``--quant METHOD`` decodes with the loaded model's quantized copy (built once per model and method, then cached);
``--compare`` runs the float reference and the quantized copy side by side on the same prompt, settings and seed,
and scores the quantized model on the reference's tokens (teacher forcing).
"""

from __future__ import annotations

from dataclasses import dataclass

from playground.config.catalog import SharedGroup, register_shared_group
from playground.config.groups import SettingsGroup, register_group
from playground.config.table import setting

QUANT_METHODS = ("none", "rtn-int8", "rtn-int8-asym", "rtn-int4", "zeroquant", "naive-w8a8", "smoothquant", "awq")
# The quick copies a quantized drafter, amateur or cheap model chooses from (engine/variants.py builds them): int4 in
# groups of 32 (the LM head float, or int4 too) or int8 per channel.
QUICK_COPIES = ("rtn-int4", "rtn-int4-head", "rtn-int8")
GROUP_SIZES = (32, 64, 128)


@register_group
@dataclass(frozen=True)
class QuantSettings(SettingsGroup):
    name = "quant"
    title = "Quantization"
    order = 30

    def active(self) -> bool:
        return self.quant != "none"

    quant: str = setting(
        "none", "quantization", "decode with the model's quantized copy: rtn-int8 (per-channel, symmetric), "
        "rtn-int8-asym (with zero point), rtn-int4 (group-wise, packed two per byte), zeroquant (group-wise int8 "
        "weights + per-token int8 activations), naive-w8a8 (int8 weights and activations, no smoothing), "
        "smoothquant (W8A8 after moving activation outliers into the weights), awq (int4 with activation-aware "
        "scales); none = the model as loaded", choices=QUANT_METHODS)
    group_size: int = setting(128, "group size", "weights per quantization group for the group-wise methods "
                              "(rtn-int4, zeroquant, awq): 32, 64 or 128", minimum=32, maximum=128, step=32)
    smooth_alpha: float = setting(0.5, "smoothing α", "SmoothQuant's migration strength: 0 leaves outliers in the "
                                  "activations, 1 moves them all into the weights", minimum=0.0, maximum=1.0,
                                  step=0.05)
    calibration_tokens: int = setting(512, "calibration tokens", "tokens of the shipped calibration text that "
                                      "SmoothQuant and AWQ measure activations on", minimum=16, maximum=4096)
    compare: bool = setting(False, "compare", "run the reference next to the quantized copy, same prompt, settings "
                            "and seed, and score the quantized model on the reference's tokens (teacher forcing)")

    def summary(self) -> str:
        if self.quant == "none":
            return "no quantization"
        group = f" g{self.group_size}" if self.quant in ("rtn-int4", "zeroquant", "awq") else ""
        alpha = f" α={self.smooth_alpha:g}" if self.quant == "smoothquant" else ""
        return f"{self.quant}{group}{alpha}" + (" vs reference" if self.compare else "")

    def cross_checks(self) -> list[tuple[bool, str]]:
        return [(self.group_size in GROUP_SIZES, f"group size must be one of {', '.join(map(str, GROUP_SIZES))}, "
                 f"not {self.group_size}"),
                (self.quant != "none" or not self.compare,
                 "--compare needs a method to compare with the reference: add --quant METHOD")]


# --quant applies across strategies: its wrapper runs the strategy on the quantized copy (or the lab, --compare).
register_shared_group(SharedGroup(
    QuantSettings, "--quant runs a strategy on the model's quantized copy",
    "does not take it (it has its own options for that, if any)", excluding=("compare", "contrastive", "cascade"),
    wrapper="playground.engine.quantized.compare:run_quant_wrapper", order=20))
