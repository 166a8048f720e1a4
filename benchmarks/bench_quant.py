"""Every quantization method on the default model, measured side by side in one process.

1. Per-shape kernel timings that justify ``QuantLinear``'s rule (``choose_kernel``): one decode row (and 4 rows)
   times each SmolLM2 weight shape in fp32, torch's int4 kernel (bf16 activations, as ``QuantLinear`` runs it),
   torch's int8 weight-only kernel, and the W8A8 paths (per-token int8 activation quantization included): emulated
   in float (dequantized weights) and torch's integer GEMM (``_int_mm``); weights are cycled through 30 copies so
   they are cold in cache as in a real decode step.
2. Each method vs the float32 reference: stored weight bytes, run-time copy bytes, greedy decode tokens/s (medians
   over rounds that alternate the variants), and how many greedy tokens agree with the float model. The methods:
   round to nearest (int8, int4), ZeroQuant, naive W8A8 and SmoothQuant (α 0.5; integer GEMM, and naive W8A8
   emulated too), AWQ int4 g128 (scales searched on the calibration text). Every copy stores its decoder linears
   low-bit (``QuantLinear``).

The float model is itself the dequantized Q4_1 model (asymmetric int4 group 32 reproduces it exactly), so quality
comparisons against it understate quantization error. Machines here are shared: only ratios within one run mean much.

    .venv/bin/python benchmarks/bench_quant.py [--new-tokens 32] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
import torch.nn.functional as F

from playground.config import ModelSettings
from playground.engine.quant.awq import awq
from playground.engine.quant.calibration import activation_stats, load_text
from playground.engine.quant.linear import int8_rows, model_runtime_bytes, model_weight_bytes, quantize_model
from playground.engine.quant.smoothquant import naive_w8a8, smoothquant
from playground.models.default_model import fetch_default_model
from playground.models.loading import load_model

SHAPES = [("k/v", 192, 576), ("q/o", 576, 576), ("gate/up", 1536, 576), ("down", 576, 1536),
          ("lm head", 49152, 576)]
VARIANTS = [  # label, method, group, quantize_lm_head (RTN methods: quantize_model)
    ("float32", None, None, False),
    ("rtn-int8 per-channel", "rtn-int8", None, False),
    ("rtn-int8-asym per-channel", "rtn-int8-asym", None, False),
    ("rtn-int4 g32", "rtn-int4", 32, False),
    ("rtn-int4 g128", "rtn-int4", 128, False),
    ("rtn-int4 g32 + int4 head", "rtn-int4", 32, True),
    ("zeroquant w8a8 g32", "zeroquant", 32, False),
]
CALIBRATION_TOKENS = 512
PROMPT = "Write a short paragraph about lighthouses and the people who kept them."


def timed_cycle(calls, repeats: int = 5) -> float:
    for call in calls:
        call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for call in calls:
            call()
        times.append((time.perf_counter() - start) / len(calls))
    return statistics.median(times) * 1e6


def kernel_table() -> None:
    print("1. Kernel timings per weight shape (us per call, weights cold: cycled through copies)")
    print(f"  {'layer':<8} {'out x in':>12} {'rows':>4} {'fp32':>9} {'int4pack':>9} {'int8pack':>9} "
          f"{'fp32/int4':>9} {'fp32/int8':>9} {'w8a8 emu':>9} {'w8a8 int':>9} {'emu/int':>8}")
    for label, out, cols in SHAPES:
        copies = 2 if out > 10000 else 30
        ws = [torch.randn(out, cols) for _ in range(copies)]
        p4 = [torch.ops.aten._convert_weight_to_int4pack_for_cpu(torch.randint(0, 16, (out, cols), dtype=torch.int32),
                                                                 1) for _ in range(copies)]
        sz = [torch.randn(cols // 32, out, 2).to(torch.bfloat16) for _ in range(copies)]
        w8 = [torch.randint(-127, 128, (out, cols), dtype=torch.int8) for _ in range(copies)]
        s8 = torch.rand(out)
        w8t = [w.t().contiguous() for w in w8]  # _int_mm's [in, out] operand, as QuantLinear's int8mm holds it
        for rows in (1, 4):
            x = torch.randn(rows, cols)
            fp = timed_cycle([lambda w=w, x=x: F.linear(x, w) for w in ws])
            i4 = timed_cycle([lambda p=p, s=s, x=x: torch.ops.aten._weight_int4pack_mm_for_cpu(
                x.to(torch.bfloat16), p, 32, s).float() for p, s in zip(p4, sz, strict=True)])
            i8 = timed_cycle([lambda w=w, x=x, s8=s8: torch.ops.aten._weight_int8pack_mm(x, w, s8) for w in w8],
                             repeats=3)
            emu = timed_cycle([lambda w=w, x=x: w8a8_emulated(x, w) for w in ws])
            imm = timed_cycle([lambda w=w, x=x, s8=s8: w8a8_integer(x, w, s8) for w in w8t])
            print(f"  {label:<8} {f'{out}x{cols}':>12} {rows:>4} {fp:>9.0f} {i4:>9.0f} {i8:>9.0f} "
                  f"{fp / i4:>8.2f}x {fp / i8:>8.2f}x {emu:>9.0f} {imm:>9.0f} {emu / imm:>7.2f}x")
    print("  (w8a8: per-token int8 activation quantization + the product; emu: F.linear on the dequantized int8 "
          "weight in fp32; int: torch._int_mm int8 x int8 -> int32, then the float rescale)")


def w8a8_emulated(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    codes, scale = int8_rows(x)
    return F.linear(codes * scale, w)


def w8a8_integer(x: torch.Tensor, w_t: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    codes, scale = int8_rows(x)
    return torch._int_mm(codes, w_t).float() * (scale * w_scale)


def greedy(model, ids: torch.Tensor, new_tokens: int) -> tuple[list[int], float]:
    with torch.no_grad():
        model.generate(ids, max_new_tokens=2, min_new_tokens=2, do_sample=False)  # warm (builds run-time copies)
        start = time.perf_counter()
        out = model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
        seconds = time.perf_counter() - start
    return out[0, ids.shape[1]:].tolist(), new_tokens / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--skip-kernels", action="store_true")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    if not args.skip_kernels:
        kernel_table()

    fetch_default_model()
    lm = load_model(ModelSettings(device="cpu", dtype="float32"))
    messages = [{"role": "user", "content": PROMPT}]
    ids = lm.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    ids = ids["input_ids"]
    builders = {label: (lambda method=method, group=group, head=head: lm.model if method is None else
                        quantize_model(lm.model, method, group, quantize_lm_head=head))
                for label, method, group, head in VARIANTS}
    calibration = load_text("calibration")
    stats = activation_stats(lm.model, lm.tokenizer, calibration, CALIBRATION_TOKENS)
    builders.update({
        "naive w8a8 (int GEMM)": lambda: naive_w8a8(lm.model),
        "naive w8a8 (emulated)": lambda: naive_w8a8(lm.model, kernel="dequant"),
        "smoothquant w8a8 a=0.5": lambda: smoothquant(lm.model, stats, 0.5),
        "awq int4 g128": lambda: awq(lm.model, lm.tokenizer, calibration, group_size=128,
                                     max_tokens=CALIBRATION_TOKENS),
    })
    models = {}
    for label, build in builders.items():
        start = time.perf_counter()
        models[label] = build()
        if models[label] is not lm.model:
            print(f"  quantized {label:<28} in {time.perf_counter() - start:5.1f} s", flush=True)
    speeds: dict[str, list[float]] = {label: [] for label in models}
    tokens: dict[str, list[int]] = {}
    for _ in range(args.rounds):
        for label, model in models.items():
            tokens[label], rate = greedy(model, ids, args.new_tokens)
            speeds[label].append(rate)
    ref_bytes = model_weight_bytes(lm.model)
    ref_rate = statistics.median(speeds["float32"])
    ref_tokens = tokens["float32"]
    print(f"\n2. Methods vs float32: prompt {ids.shape[1]} tokens, {args.new_tokens} greedy tokens, "
          f"{args.rounds} alternating rounds (median tok/s)")
    print(f"  {'variant':<28} {'weights MB':>10} {'vs fp32':>8} {'run-time copy MB':>16} {'tok/s':>7} "
          f"{'vs fp32':>8} {'same tokens':>11}")
    for label, model in models.items():
        stored = model_weight_bytes(model)
        rate = statistics.median(speeds[label])
        pairs = zip(tokens[label], ref_tokens, strict=True)
        agree = next((i for i, (a, b) in enumerate(pairs) if a != b), len(ref_tokens))
        copy_mb = model_runtime_bytes(model) / 1e6
        print(f"  {label:<28} {stored / 1e6:>10.1f} {stored / ref_bytes:>7.2f}x {copy_mb:>16.1f} "
              f"{rate:>7.1f} {rate / ref_rate:>7.2f}x {agree:>6}/{len(ref_tokens)}")
    print("  (weights MB: as stored, tied embedding once; run-time copy: QuantLinear's dequantized fp32 or int4 "
          "kernel-layout copy; same tokens: greedy prefix equal to float32's)")
    print("  float32 text:", repr(lm.tokenizer.decode(ref_tokens)))
    print("  rtn-int4 g128 text:", repr(lm.tokenizer.decode(tokens["rtn-int4 g128"])))
    print("  awq int4 g128 text:", repr(lm.tokenizer.decode(tokens["awq int4 g128"])))
    print("  smoothquant text:  ", repr(lm.tokenizer.decode(tokens["smoothquant w8a8 a=0.5"])))


if __name__ == "__main__":
    main()
