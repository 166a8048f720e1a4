"""Contrastive decoding with a layer amateur against plain greedy on the default model, side by side in one process.

The layer amateur's logits come from the expert's own forward pass (a hook keeps one layer's output; the final norm
and LM head make logits of it), so a contrastive step should cost at most ``GOAL`` × a greedy step. Measured: the
engine's own ``step_ms`` of every step but the first (a greedy run's first step reuses the prefill's logits), per
run the median, over prompts × repeats, the two strategies alternating within every prompt. Also printed: how often
the contrast changed the expert's choice, the amateur's and the contrast maths' share of a step, and (with
``--quantized``) the quantized amateur's step cost for comparison.

    .venv/bin/python benchmarks/bench_contrastive.py [--new-tokens 48] [--repeats 3] [--quantized]
"""

from __future__ import annotations

import argparse
import os
import statistics

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from side_by_side import report

from playground.config import ModelSettings, RunSettings
from playground.engine.strategies import run_strategy
from playground.events import RunFinished, TokenStep
from playground.events.contrastive import ContrastStep
from playground.models.default_model import fetch_default_model
from playground.models.loading import load_model

PROMPTS = [
    "Explain how a rainbow forms.",
    "Write a short story about a dragon who learns to bake bread.",
    "What is the capital of France?",
]
GOAL = 1.3


def run(lm, prompt: str, new_tokens: int, **flat) -> tuple[list[TokenStep], list[ContrastStep], RunFinished]:
    events = list(run_strategy(lm, RunSettings.from_flat(prompt=prompt, max_new_tokens=new_tokens, **flat)))
    assert isinstance(events[-1], RunFinished)
    return ([e for e in events if isinstance(e, TokenStep)], [e for e in events if isinstance(e, ContrastStep)],
            events[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quantized", action="store_true", help="also time the quantized (rtn-int4) amateur")
    args = parser.parse_args()
    torch.set_num_threads(min(torch.get_num_threads(), os.cpu_count() or 1))
    fetch_default_model()
    lm = load_model(ModelSettings(device="cpu", dtype="float32"))
    configs = {"greedy": {"strategy": "greedy"},
               "contrastive (layer amateur)": {"strategy": "contrastive", "amateur": "layer"}}
    if args.quantized:
        configs["contrastive (quantized amateur)"] = {"strategy": "contrastive", "amateur": "quantized"}
    for flat in configs.values():  # warm-up (and the quantized copy, built once)
        run(lm, PROMPTS[0], 4, **flat)
    step_ms: dict[str, list[float]] = {name: [] for name in configs}
    changed, amateur_ms, contrast_ms, plausible = [], [], [], []
    for _ in range(args.repeats):
        for prompt in PROMPTS:
            for name, flat in configs.items():
                tokens, steps, _ = run(lm, prompt, args.new_tokens, **flat)
                step_ms[name].append(statistics.median(t.step_ms for t in tokens[1:]))
                if name == "contrastive (layer amateur)":
                    changed.append(sum(s.changed for s in steps) / len(steps))
                    amateur_ms.append(statistics.median(s.amateur_ms for s in steps[1:]))
                    contrast_ms.append(statistics.median(s.contrast_ms for s in steps[1:]))
                    plausible.append(statistics.fmean(s.plausible_count for s in steps))
    rates = {name: [1000.0 / ms for ms in values] for name, values in step_ms.items()}
    header = (f"SmolLM2-135M fp32, {torch.get_num_threads()} threads, {args.new_tokens} new tokens, "
              f"{len(PROMPTS)} prompts x {args.repeats} repeats; per run the median step time of steps 1..n")
    report(header, "steps/s", ("greedy", rates["greedy"]),
           ("contrastive (layer amateur)", rates["contrastive (layer amateur)"]), goal=1 / GOAL)
    greedy_ms = statistics.median(step_ms["greedy"])
    for name in configs:
        ms = statistics.median(step_ms[name])
        print(f"  {name:<32} {ms:6.1f} ms per step = {ms / greedy_ms:4.2f}x a greedy step")
    ratio = statistics.median(step_ms["contrastive (layer amateur)"]) / greedy_ms
    print(f"contrastive step / greedy step: {ratio:.2f}x (goal <= {GOAL}x): {'met' if ratio <= GOAL else 'NOT met'}")
    print(f"layer amateur: {statistics.median(amateur_ms):.2f} ms per step (norm + LM head), contrast maths "
          f"{statistics.median(contrast_ms):.2f} ms; the contrast changed the expert's choice at "
          f"{statistics.fmean(changed):.0%} of steps; plausible set {statistics.fmean(plausible):.1f} tokens")


if __name__ == "__main__":
    main()
