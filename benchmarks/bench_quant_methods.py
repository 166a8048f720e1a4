"""Quantization methods side by side on the default model: perplexity and KL to the float model.

Rows: the reference (float32), weight-only RTN int8 (per channel) and int4 (asymmetric, group 128), AWQ int4
(group 128, scales searched on the calibration text), naive W8A8 and SmoothQuant W8A8 (alpha 0.5). Every metric
is measured on the evaluation text (Lincoln), never on the calibration text (the Declaration of Independence):
perplexity, per-token KL(reference || method) mean / median / p99 / max, top-1 agreement, and the first position
where the greedy continuation of a prompt departs from the reference's (-1: none within the window).

Every copy stores its weights low-bit (``QuantLinear``); speed and weight bytes are in ``bench_quant.py``.
The "float" reference is itself the dequantized Q4_1 GGUF, so every error here understates the error against the
original bf16 weights.

    .venv/bin/python benchmarks/bench_quant_methods.py [--eval-tokens 512] [--calib-tokens 512] [--grid 20]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from playground.config import ModelSettings
from playground.engine.quant.awq import awq
from playground.engine.quant.calibration import activation_stats, load_text, text_ids
from playground.engine.quant.linear import quantize_model
from playground.engine.quant.metrics import first_divergence, kl_stats, perplexity, sequence_logits
from playground.engine.quant.smoothquant import naive_w8a8, smoothquant
from playground.models.default_model import fetch_default_model
from playground.models.loading import load_model

PROMPT = "Write a short story about a dragon who learns to bake bread."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eval-tokens", type=int, default=512)
    parser.add_argument("--calib-tokens", type=int, default=512)
    parser.add_argument("--grid", type=int, default=20)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--group-size", type=int, default=128)
    args = parser.parse_args()

    fetch_default_model()
    lm = load_model(ModelSettings(device="cpu", dtype="float32"))
    model, tokenizer = lm.model, lm.tokenizer
    calibration = load_text("calibration")
    eval_ids = text_ids(tokenizer, load_text("evaluation"), args.eval_tokens)
    prompt_ids = tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True,
                                               tokenize=True, return_dict=True)["input_ids"]
    print(f"model {lm.name}, torch {torch.__version__}, {torch.get_num_threads()} threads; "
          f"{len(eval_ids)} evaluation tokens, {args.calib_tokens} calibration tokens, "
          f"greedy window {args.new_tokens} tokens")

    g = args.group_size
    start = time.perf_counter()
    stats = activation_stats(model, tokenizer, calibration, args.calib_tokens)
    print(f"activation statistics: {time.perf_counter() - start:.1f} s")
    builders = {
        "reference (float32)": lambda: model,
        "rtn int8 per-channel (W8)": lambda: quantize_model(model, "rtn-int8", None),
        f"rtn int4 g{g} (asym)": lambda: quantize_model(model, "rtn-int4", g),
        f"awq int4 g{g} (asym)": lambda: awq(model, tokenizer, calibration, group_size=g, grid=args.grid,
                                             max_tokens=args.calib_tokens),
        "naive W8A8": lambda: naive_w8a8(model),
        "smoothquant W8A8 a=0.5": lambda: smoothquant(model, stats, alpha=0.5),
    }
    reference_logits = sequence_logits(model, eval_ids)
    rows = {}
    header = (f"{'method':<26} {'build s':>7} {'ppl':>8} {'KL mean':>9} {'KL med':>9} {'KL p99':>9} {'KL max':>9} "
              f"{'top1':>7} {'diverge':>7}")
    print(header)
    print("-" * len(header))
    for name, build in builders.items():
        start = time.perf_counter()
        quantized = build()
        built = time.perf_counter() - start
        logits = reference_logits if quantized is model else sequence_logits(quantized, eval_ids)
        ppl = perplexity(logits, eval_ids)
        kl = kl_stats(reference_logits, logits, eval_ids)
        diverge = -1 if quantized is model else first_divergence(model, quantized, prompt_ids, args.new_tokens)
        rows[name] = (ppl, kl)
        print(f"{name:<26} {built:>7.1f} {ppl:>8.3f} {kl['mean']:>9.5f} {kl['median']:>9.5f} {kl['p99']:>9.5f} "
              f"{kl['max']:>9.5f} {kl['top1_agreement']:>7.3f} {diverge:>7d}", flush=True)

    ref_ppl = rows["reference (float32)"][0]
    names = list(rows)
    int8, rtn4, awq4, naive, smooth = names[1:]

    def verdict(ok: bool) -> str:
        return "holds" if ok else "DOES NOT hold"

    print()
    def compare(claim: str, better: str, worse: str) -> None:
        (ppl_a, kl_a), (ppl_b, kl_b) = rows[better], rows[worse]
        print(f"{claim}: {verdict(ppl_a < ppl_b and kl_a['mean'] < kl_b['mean'])} "
              f"(ppl {ppl_a:.3f} vs {ppl_b:.3f}; KL mean {kl_a['mean']:.4f} vs {kl_b['mean']:.4f})")

    compare(f"AWQ int4 beats RTN int4 (g{g})", awq4, rtn4)
    compare("SmoothQuant W8A8 beats naive W8A8", smooth, naive)
    close = abs(rows[int8][0] / ref_ppl - 1) < 0.01
    print(f"int8 weight-only ~ reference (ppl within 1%): {verdict(close)} (ppl {rows[int8][0]:.3f} vs {ref_ppl:.3f}; "
          f"KL mean {rows[int8][1]['mean']:.5f})")


if __name__ == "__main__":
    main()
