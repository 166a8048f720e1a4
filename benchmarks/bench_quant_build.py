"""How long `--quant METHOD` makes a user wait the first time: ``quantized_lm`` on the default model, per method.

One line per method: seconds to build the quantized copy and measure it (calibration pass where the method needs
it, quantization, per-linear weight errors, perplexities of both models on 256 evaluation tokens: everything the
user waits for before the first token), the goal (under two minutes each, issue 10), the weight bytes the copy
holds against the reference's, and the perplexities. A second call must come from the cache: its wall time is
printed too. Each method's copy replaces the previous one (one kept at a time), as in the app.

Every method stores its decoder linears low-bit (int8 or packed int4 codes with float32 scales), so its weight bytes
are the stored size; AWQ and SmoothQuant also spend a calibration pass (AWQ a scale search per layer).
Machines here are shared: the seconds are one run's, on this CPU's threads.

    .venv/bin/python benchmarks/bench_quant_build.py [--methods rtn-int8,awq] [--group-size 128]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from playground.config import QUANT_METHODS, ModelSettings, QuantSettings
from playground.engine.quantized.apply import quantized_lm
from playground.models.default_model import fetch_default_model
from playground.models.loading import load_model

GOAL_S = 120.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default=",".join(m for m in QUANT_METHODS if m != "none"))
    parser.add_argument("--group-size", type=int, default=128)
    parser.add_argument("--calibration-tokens", type=int, default=512)
    args = parser.parse_args()

    fetch_default_model()
    lm = load_model(ModelSettings(device="cpu", dtype="float32"))
    print(f"model {lm.name}, torch {torch.__version__}, {torch.get_num_threads()} threads, group {args.group_size}, "
          f"{args.calibration_tokens} calibration tokens; goal: each under {GOAL_S:.0f} s")
    print(f"{'method':<22} {'build s':>8} {'goal':>5} {'cached s':>9} {'weight MB':>10} {'ref MB':>8} "
          f"{'ppl ref':>8} {'ppl quant':>10}")
    for method in args.methods.split(","):
        quant = QuantSettings(quant=method, group_size=args.group_size, calibration_tokens=args.calibration_tokens)
        start = time.perf_counter()
        qlm, ready = quantized_lm(lm, quant)
        wall = time.perf_counter() - start
        again = time.perf_counter()
        _, cached = quantized_lm(lm, quant)
        cached_s = time.perf_counter() - again
        assert cached.cached and not ready.cached
        name = qlm.name.split(" · ", 1)[1]
        print(f"{name:<22} {wall:>8.1f} {'ok' if wall < GOAL_S else 'SLOW':>5} {cached_s:>9.4f} "
              f"{ready.weight_bytes / 1e6:>10.1f} {ready.reference_weight_bytes / 1e6:>8.1f} "
              f"{ready.perplexity['reference']:>8.2f} {ready.perplexity[method]:>10.2f}", flush=True)


if __name__ == "__main__":
    main()
