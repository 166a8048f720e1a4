"""A watermarked decode step against a plain one: the same sampling run (default model, same prompt and seed) plain,
with Kirchenbauer's lefthash and selfhash green lists, and with SynthID-Text, runs alternating so machine noise hits
each. Reported per scheme: the median step time (``TokenStep.step_ms``: the model pass, the chain, the step's
record) and the wall time per token of the whole run (with the watermark's live record: colour, z-score, entropy,
KL), each as a ratio to plain. On a shared machine those whole-run figures are noisy, so the watermark's own work is
also timed apart on the plain run's real logits and contexts (the chain entry's ``apply``, cold green-list caches
each run; and the live record per token), and stated as ``1 + its median / the plain step's median``
(``isolated_ratio``). Targets: lefthash ≤ 1.05× plain; selfhash ≤ 1.5×, SynthID ≤ 1.25× (the step itself).

    .venv/bin/python benchmarks/bench_watermark.py [--model PATH] [--new-tokens 64] [--repeats 3] [--top-k 0]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from playground.config import ModelSettings, RunSettings
from playground.engine.processors import SamplerRun, build_pipeline
from playground.engine.strategies import run_strategy
from playground.events import TokenStep
from playground.events.watermark import WatermarkStep
from playground.models.default_model import fetch_default_model
from playground.models.loading import load_model

PROMPT = "Write a long story about a dragon who learns to bake bread."
SCHEMES = {
    "plain": {},
    "lefthash": dict(watermark="kirchenbauer", seeding_scheme="lefthash"),
    "selfhash": dict(watermark="kirchenbauer", seeding_scheme="selfhash", context_width=4),
    "synthid": dict(watermark="synthid"),
}
TARGETS = {"lefthash": 1.05, "selfhash": 1.5, "synthid": 1.25}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--top-k", type=int, default=0)
    args = parser.parse_args()
    if args.model is None:
        fetch_default_model()
    lm = load_model(ModelSettings(path=args.model, device=args.device))
    steps: dict[str, list[float]] = {name: [] for name in SCHEMES}
    walls: dict[str, list[float]] = {name: [] for name in SCHEMES}
    z: dict[str, list[float]] = {name: [] for name in SCHEMES}
    for repeat in range(args.repeats + 1):  # the first round warms up (and fills the green-list caches)
        for name, values in SCHEMES.items():
            settings = RunSettings.from_flat(prompt=PROMPT, strategy="sample", seed=repeat, top_k=args.top_k,
                                             max_new_tokens=args.new_tokens, **values).validate()
            start = time.perf_counter()
            events = list(run_strategy(lm, settings))
            wall = time.perf_counter() - start
            tokens = [e for e in events if isinstance(e, TokenStep)]
            marks = [e for e in events if isinstance(e, WatermarkStep)]
            if repeat == 0:
                continue
            steps[name] += [t.step_ms for t in tokens[1:]]
            walls[name].append(wall * 1000 / max(len(tokens), 1))
            if marks:
                z[name].append(marks[-1].z_score)
    apply_ms, record_ms = isolated(lm, args)
    plain_step = statistics.median(steps["plain"])
    plain_wall = statistics.median(walls["plain"])
    for name in SCHEMES:
        step = statistics.median(steps[name])
        wall = statistics.median(walls[name])
        row = {"scheme": name, "step_ms": round(step, 3), "step_ratio": round(step / plain_step, 3),
               "wall_ms_per_token": round(wall, 3), "wall_ratio": round(wall / plain_wall, 3),
               "z_final_median": round(statistics.median(z[name]), 2) if z[name] else None,
               "target": TARGETS.get(name), "device": str(lm.device), "new_tokens": args.new_tokens}
        if name in apply_ms:
            row["apply_ms"] = round(statistics.median(apply_ms[name]), 3)
            row["record_ms"] = round(statistics.median(record_ms[name]), 3)
            row["isolated_ratio"] = round(1 + row["apply_ms"] / plain_step, 4)
            row["isolated_with_record"] = round(1 + (row["apply_ms"] + row["record_ms"]) / plain_step, 4)
            row["meets_target"] = row["isolated_ratio"] <= TARGETS[name]
        print(json.dumps(row), flush=True)


def isolated(lm, args: argparse.Namespace) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Per scheme: the chain entry's ``apply`` and the live record's time per token (ms), on the plain run's
    teacher-forced logits, the green-list caches cleared before each run."""
    from playground.engine.observers.watermark import WatermarkObserver
    from playground.watermarking.kirchenbauer import GreenLists

    settings = RunSettings.from_flat(prompt=PROMPT, strategy="sample", seed=0, max_new_tokens=args.new_tokens)
    events = list(run_strategy(lm, settings.validate()))
    from playground.events import RunStarted

    prompt = list(next(e for e in events if isinstance(e, RunStarted)).prompt_token_ids)
    generated = [e.token_id for e in events if isinstance(e, TokenStep)]
    context = torch.tensor([prompt + generated], device=lm.device)
    with torch.inference_mode():
        logits = lm.model(context).logits[0, len(prompt) - 1: -1].float()
    apply_ms: dict[str, list[float]] = {}
    record_ms: dict[str, list[float]] = {}
    for name, values in SCHEMES.items():
        if not values:
            continue
        apply_ms[name], record_ms[name] = [], []
        for _ in range(args.repeats):
            GreenLists._shared.clear()
            s = RunSettings.from_flat(prompt=PROMPT, strategy="sample", **values).validate()
            run = SamplerRun.of(s, torch.Generator(device=lm.device), sampling=True)
            (entry,) = build_pipeline(s, sampling=True, vocab_size=lm.model.config.vocab_size, run=run)
            from playground.config.samplers.watermark import WatermarkSettings

            observer = WatermarkObserver(s.group(WatermarkSettings), int(lm.model.config.vocab_size))
            with torch.inference_mode():
                for i in range(len(generated)):
                    ids = context[:, : len(prompt) + i]
                    row = logits[i: i + 1]
                    if lm.device.type == "cuda":
                        torch.cuda.synchronize()
                    start = time.perf_counter()
                    entry.apply(ids, row)
                    if lm.device.type == "cuda":
                        torch.cuda.synchronize()
                    apply_ms[name].append((time.perf_counter() - start) * 1000)
                    start = time.perf_counter()
                    observer._step(i, ids, generated[i], row, len(prompt))
                    record_ms[name].append((time.perf_counter() - start) * 1000)
    return apply_ms, record_ms


if __name__ == "__main__":
    main()
