"""Activation steering's cost on the default model: a steered greedy step against an unsteered one, side by side in
one process (the same prompts, configurations alternating within every prompt and repeat).

The vector is built here from a small contrast set (mean difference at every block but the first, so every steered
block's hook runs: the add, the projection reading, the finiteness check of the logits), saved and read back as
``--steer`` reads it. Rows: plain greedy; steered (``--steer FILE:4``); steered with the unsteered comparison
(``--steer-compare``: one more pass per step, shown for its stated cost, not part of the target). Per-token step time
is the median over the steps after the first (a plain run's first step reuses the prefill's logits), over prompts x
repeats. Goal: steered ≤ 1.05× plain.

    .venv/bin/python benchmarks/bench_steering.py [--new-tokens 48] [--repeats 3] [--device cpu] [--dtype auto]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from playground.config import ModelSettings, RunSettings
from playground.engine.steering.build import ContrastSet, build_vector
from playground.engine.steering.files import save_vector
from playground.engine.strategies import run_strategy
from playground.events import TokenStep
from playground.events.steering import SteerStep
from playground.models.default_model import fetch_default_model
from playground.models.loading import load_model

PROMPTS = ["Explain how a rainbow forms.", "Write a short story about a dragon who learns to bake bread.",
           "List three things to pack for a hike."]
CONTRAST = ContrastSet(("I am so happy today!", "What a wonderful, joyful day.", "I love this, it is great."),
                       ("I am so sad today.", "What a terrible, miserable day.", "I hate this, it is awful."),
                       "happy-sad")
GOAL = 1.05


def step_times(events: list) -> list[float]:
    return [e.step_ms for e in events if isinstance(e, TokenStep)][1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--strength", type=float, default=4.0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="auto")
    args = parser.parse_args()
    fetch_default_model()
    lm = load_model(ModelSettings(device=args.device, dtype=args.dtype))
    vector = build_vector(lm, CONTRAST, method="mean-diff")
    assert vector is not None
    folder = Path(tempfile.mkdtemp(prefix="bench-steering-"))
    path = save_vector(vector, folder / "happy-sad.safetensors")
    configs = {
        "plain": {},
        "steered": {"steer": (f"{path}:{args.strength:g}",)},
        "steered + unsteered comparison": {"steer": (f"{path}:{args.strength:g}",), "steer_compare": True},
    }
    times: dict[str, list[float]] = {label: [] for label in configs}
    changed = 0
    for _ in range(args.repeats):
        for prompt in PROMPTS:
            outputs = {}
            for label, flat in configs.items():
                settings = RunSettings.from_flat(prompt=prompt, max_new_tokens=args.new_tokens, **flat)
                events = list(run_strategy(lm, settings))
                times[label] += step_times(events)
                outputs[label] = [e.token_id for e in events if isinstance(e, TokenStep)]
                if label == "steered":
                    assert sum(isinstance(e, SteerStep) for e in events) == len(outputs[label])
            changed += outputs["plain"] != outputs["steered"]
    plain = statistics.median(times["plain"])
    print(f"{lm.name} on {lm.device} ({lm.dtype_name}), {len(vector.layers)} steered blocks, strength "
          f"{args.strength:g}, {args.new_tokens} tokens x {len(PROMPTS)} prompts x {args.repeats} repeats")
    print(f"{'configuration':34} {'median step ms':>15} {'ratio':>7}")
    for label in configs:
        median = statistics.median(times[label])
        print(f"{label:34} {median:15.2f} {median / plain:7.3f}")
    ratio = statistics.median(times["steered"]) / plain
    print(f"steered / plain = {ratio:.3f} (goal ≤ {GOAL}); outputs changed by the steering in {changed} of "
          f"{len(PROMPTS) * args.repeats} runs")


if __name__ == "__main__":
    main()
