"""`playground quant-report`: one row per quantization method against the loaded reference model — weight bytes,
perplexity on the evaluation text, and the statistics llama.cpp's `llama-perplexity --kl-divergence` reports.

Every method's copy stores its decoder linears low-bit (``QuantLinear``: int8 or packed int4 codes with float32
scales); ``weight_bytes`` counts what is stored (embeddings, norms and LM head in float, the codes, scales and zero
points, AWQ's o_proj input scales), not the run-time copies some layers build on first use. ``stored`` says how.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from playground.config import ConfigError
from playground.engine.quant.calibration import activation_stats, load_text, text_ids
from playground.engine.quant.linear import STORED, model_weight_bytes, quantize_model
from playground.engine.quant.metrics import kl_stats, perplexity, sequence_logits
from playground.engine.quant.smoothquant import naive_w8a8, smoothquant

METHODS = ("rtn-int8", "rtn-int8-asym", "rtn-int4", "zeroquant", "naive-w8a8", "smoothquant", "awq")
PER_CHANNEL = ("rtn-int8", "rtn-int8-asym")  # RTN int8 methods: one scale per output channel


def check_methods(methods: list[str]) -> None:
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ConfigError(f"unknown method {', '.join(unknown)}: choose from {', '.join(METHODS)}")


def build(model: Any, tokenizer: Any, method: str, group_size: int | None, calibration_tokens: int) -> tuple[Any, str]:
    """The quantized copy of ``model`` for ``method`` and how its weights are stored."""
    if method in ("rtn-int8", "rtn-int8-asym", "rtn-int4", "zeroquant"):
        group = None if method in PER_CHANNEL else group_size
        return quantize_model(model, method, group), STORED[method]
    if method == "naive-w8a8":
        return naive_w8a8(model), STORED[method]
    calibration = load_text("calibration")
    if method == "smoothquant":
        stats = activation_stats(model, tokenizer, calibration, calibration_tokens)
        return smoothquant(model, stats, alpha=0.5), STORED[method]
    from playground.engine.quant.awq import awq

    return awq(model, tokenizer, calibration, group_size=group_size, max_tokens=calibration_tokens), STORED[method]


def report_rows(model: Any, tokenizer: Any, methods: list[str], group_size: int | None = 128,
                eval_tokens: int = 512, calibration_tokens: int = 512) -> Iterator[dict[str, Any]]:
    """The reference's row, then one per method (each built, measured and dropped before the next)."""
    check_methods(methods)
    ids = text_ids(tokenizer, load_text("evaluation"), eval_tokens)
    reference = sequence_logits(model, ids)
    yield {"method": "reference", "group_size": None, "weight_bytes": model_weight_bytes(model),
           "stored": str(next(model.parameters()).dtype).removeprefix("torch."),
           "perplexity": perplexity(reference, ids), "kl_mean": 0.0, "top1_agreement": 1.0, "tokens": len(ids)}
    for method in methods:
        quantized, stored = build(model, tokenizer, method, group_size, calibration_tokens)
        stats = kl_stats(reference, quantized, ids)
        yield {"method": method, "group_size": None if method in (*PER_CHANNEL, "naive-w8a8", "smoothquant")
               else group_size, "weight_bytes": model_weight_bytes(quantized), "stored": stored,
               "perplexity": perplexity(quantized, ids), "kl_mean": stats["mean"], "kl_median": stats["median"],
               "kl_p99": stats["p99"], "kl_max": stats["max"], "top1_agreement": stats["top1_agreement"],
               "tokens": len(ids)}
        del quantized
