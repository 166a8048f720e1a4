"""How well each watermark separates watermarked from plain default-model text, and what it costs (issue 33).

For each scheme and sampler row, ``--seeds`` runs with the watermark and as many without (same prompts, seeds and
samplers); each output is scored by the detector as any text would be (re-tokenized, the prompt left out:
``playground watermark-detect``'s path). Reported per row: the z-scores' median and range, the share detected at the
threshold (watermarked: the true-positive rate; plain: the false-positive rate over these few runs, which cannot
measure a rate at z = 4), the median perplexity of the output under the unwatermarked model and the mean KL the
watermark added per token.

The sampling rows draw seed 0, 1, … on the 5 ``PROMPTS`` in turn (seed i on prompt i mod 5). Greedy is
deterministic, so its row varies the prompt instead: run i is ``greedy_prompts()[i]`` (seed unused); SynthID is
refused on greedy (its tournament needs a draw) and has no greedy row. A plain run does not depend on the scheme,
so each plain output is generated once and scored by both detectors.

    .venv/bin/python benchmarks/watermark_separation.py [--seeds 50] [--new-tokens 64]
        [--rows samplers|plain-sampling|LABEL,LABEL…] [--schemes kirchenbauer,synthid]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from playground.config import ModelSettings, RunSettings
from playground.config.samplers.watermark import WatermarkSettings
from playground.engine.strategies import run_strategy
from playground.engine.watermark.score import detect_text
from playground.events import RunFinished, RunStarted, TokenStep
from playground.events.watermark import WatermarkStep
from playground.models.default_model import fetch_default_model
from playground.models.loading import load_model
from playground.watermarking.detect import DetectionError

PROMPTS = ("Write a short story about a robot who learns to paint.", "Explain how a bicycle works.",
           "Describe a walk through a forest in autumn.", "Write a letter to a friend about your new job.",
           "What should a visitor see in Paris?")
# Greedy's prompts: every task on every subject, 5 × 10 = 50 distinct prompts.
GREEDY_TASKS = ("Write a short story about {}.", "Explain {} to a child.", "Describe {} in a few sentences.",
                "Write a poem about {}.", "Give three facts about {}.")
GREEDY_SUBJECTS = ("the ocean", "a bicycle", "a city library", "honey bees", "the moon", "a thunderstorm",
                   "baking bread", "the game of chess", "a night train", "a volcano")
SCHEMES = {"kirchenbauer": dict(watermark="kirchenbauer"), "synthid": dict(watermark="synthid")}
SAMPLERS = {
    "sampling T=1": dict(strategy="sample", temperature=1.0),
    "top-k 40": dict(strategy="sample", top_k=40),
    "min-p 0.1": dict(strategy="sample", min_p=0.1),
    "XTC 0.1/0.5": dict(strategy="sample", xtc_threshold=0.1, xtc_probability=0.5),
    "DRY 0.8": dict(strategy="sample", dry_multiplier=0.8),
    "greedy": dict(strategy="greedy"),
}


def greedy_prompts() -> list[str]:
    return [task.format(subject) for subject, task in itertools.product(GREEDY_SUBJECTS, GREEDY_TASKS)]


def run_inputs(sampler: dict, runs: int) -> list[tuple[str, int]]:
    """(prompt, seed) for each run of a row: seeds over the 5 prompts when sampling, one prompt each for greedy."""
    if sampler["strategy"] == "greedy":
        prompts = greedy_prompts()
        if runs > len(prompts):
            raise SystemExit(f"greedy has {len(prompts)} prompts; asked for {runs} runs")
        return [(prompts[i], 0) for i in range(runs)]
    return [(PROMPTS[seed % len(PROMPTS)], seed) for seed in range(runs)]


def perplexity(lm, prompt_ids: list[int], output: list[int]) -> float:
    if not output:
        return math.nan
    ids = torch.tensor([prompt_ids + output], device=lm.device)
    with torch.inference_mode():
        logp = lm.model(ids).logits[0, len(prompt_ids) - 1: -1].float().log_softmax(-1)
    nll = -logp.gather(1, torch.tensor(output, device=lm.device)[:, None]).mean()
    return float(nll.exp())


def generate(lm, prompt: str, seed: int, new_tokens: int, sampler: dict, marking: dict) -> dict:
    """One run through the engine's own path: its text, perplexity under the plain model and watermark KLs."""
    settings = RunSettings.from_flat(prompt=prompt, seed=seed, max_new_tokens=new_tokens, **sampler,
                                     **marking).validate()
    events = list(run_strategy(lm, settings))
    start = next(e for e in events if isinstance(e, RunStarted))
    done = next(e for e in events if isinstance(e, RunFinished))
    output = [e.token_id for e in events if isinstance(e, TokenStep)]
    return dict(text=done.text, perplexity=perplexity(lm, list(start.prompt_token_ids), output),
                kls=[e.kl for e in events if isinstance(e, WatermarkStep) and e.kl is not None])


def summarize(zs: list[float], ppl: list[float], threshold: float, kind: str) -> dict:
    return {f"{kind}_z_median": round(statistics.median(zs), 2),
            f"{kind}_z_range": [round(min(zs), 2), round(max(zs), 2)],
            f"{kind}_detected": round(sum(z > threshold for z in zs) / len(zs), 3),
            f"{kind}_perplexity": round(statistics.median(ppl), 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=50, help="runs per row (greedy: prompts)")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rows", default="samplers",
                        help="samplers (every row; 'all' too), plain-sampling (the T=1 row only), or row labels "
                             f"separated by commas: {', '.join(SAMPLERS)}")
    parser.add_argument("--schemes", default=",".join(SCHEMES))
    args = parser.parse_args()
    if args.rows in ("samplers", "all"):
        labels = list(SAMPLERS)
    elif args.rows == "plain-sampling":
        labels = ["sampling T=1"]
    else:
        labels = [label.strip() for label in args.rows.split(",")]
        unknown = [label for label in labels if label not in SAMPLERS]
        if unknown:
            parser.error(f"unknown rows {unknown}; rows are {list(SAMPLERS)}")
    fetch_default_model()
    lm = load_model(ModelSettings(device="auto"))
    plain_runs: dict[tuple[str, str, int], dict] = {}  # a plain run is the same for every scheme
    for label in labels:
        sampler = SAMPLERS[label]
        for scheme in args.schemes.split(","):
            marking = SCHEMES[scheme]
            if scheme == "synthid" and sampler["strategy"] == "greedy":
                continue  # refused by name: the tournament cannot act on greedy
            g = WatermarkSettings(**marking)
            began = time.perf_counter()
            zs: dict[str, list[float]] = {"watermarked": [], "plain": []}
            ppl: dict[str, list[float]] = {"watermarked": [], "plain": []}
            kls: list[float] = []
            inputs = run_inputs(sampler, args.seeds)
            for prompt, seed in inputs:
                key = (label, prompt, seed)
                if key not in plain_runs:
                    plain_runs[key] = generate(lm, prompt, seed, args.new_tokens, sampler, {})
                for kind, run in (("watermarked", generate(lm, prompt, seed, args.new_tokens, sampler, marking)),
                                  ("plain", plain_runs[key])):
                    kls += run["kls"]
                    try:
                        zs[kind].append(detect_text(lm, g, run["text"]).z_score)
                    except DetectionError:
                        continue
                    ppl[kind].append(run["perplexity"])
            out = {"scheme": scheme, "sampler": label, "settings": sampler, "runs": len(inputs),
                   "varies": "prompt" if sampler["strategy"] == "greedy" else "seed", "new_tokens": args.new_tokens,
                   "threshold": g.z_threshold, "scored": {kind: len(v) for kind, v in zs.items()}}
            for kind in zs:
                out |= summarize(zs[kind], ppl[kind], g.z_threshold, kind)
            out["mean_kl_nats"] = round(statistics.fmean(kls), 4) if kls else None
            out["seconds"] = round(time.perf_counter() - began, 1)
            print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
