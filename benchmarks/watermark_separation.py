"""How well each watermark separates watermarked from plain default-model text, and what it costs (issue 33).

For each scheme and sampler setting, ``--seeds`` sampled runs with the watermark and as many without (same prompts,
seeds and samplers); each output is scored by the detector as any text would be (re-tokenized, the prompt left out:
``playground watermark-detect``'s path). Reported per row: the z-scores' median and range, the share detected at the
threshold (watermarked: the true-positive rate; plain: the false-positive rate over these few seeds, which cannot
measure a rate at z = 4), the perplexity of the output under the unwatermarked model and the mean KL the watermark
added per token.

    .venv/bin/python benchmarks/watermark_separation.py [--seeds 50] [--new-tokens 64] [--rows all|plain-sampling]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics

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
SCHEMES = {"kirchenbauer": dict(watermark="kirchenbauer"), "synthid": dict(watermark="synthid")}
SAMPLERS = {
    "sample": dict(strategy="sample"),
    "top-k 20": dict(strategy="sample", top_k=20),
    "min-p 0.1": dict(strategy="sample", min_p=0.1),
    "XTC 0.5/0.1": dict(strategy="sample", xtc_probability=0.5, xtc_threshold=0.1),
    "DRY 0.8": dict(strategy="sample", dry_multiplier=0.8),
    "greedy": dict(strategy="greedy"),
}


def perplexity(lm, prompt_ids: list[int], output: list[int]) -> float:
    if not output:
        return math.nan
    ids = torch.tensor([prompt_ids + output], device=lm.device)
    with torch.inference_mode():
        logp = lm.model(ids).logits[0, len(prompt_ids) - 1: -1].float().log_softmax(-1)
    nll = -logp.gather(1, torch.tensor(output, device=lm.device)[:, None]).mean()
    return float(nll.exp())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=50)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rows", default="all", help="all, or plain-sampling (the 'sample' row only)")
    args = parser.parse_args()
    fetch_default_model()
    lm = load_model(ModelSettings(device="auto"))
    samplers = SAMPLERS if args.rows == "all" else {"sample": SAMPLERS["sample"]}
    for scheme, marking in SCHEMES.items():
        g = WatermarkSettings(**marking)
        for label, sampler in samplers.items():
            if scheme == "synthid" and sampler["strategy"] == "greedy":
                continue  # refused by name: the tournament cannot act on greedy
            rows = {"watermarked": [], "plain": []}
            ppl = {"watermarked": [], "plain": []}
            kls: list[float] = []
            seeds = args.seeds if sampler["strategy"] == "sample" else len(PROMPTS)
            for seed in range(seeds):
                for kind, extra in (("watermarked", marking), ("plain", {})):
                    settings = RunSettings.from_flat(prompt=PROMPTS[seed % len(PROMPTS)], seed=seed,
                                                     max_new_tokens=args.new_tokens, **sampler, **extra).validate()
                    events = list(run_strategy(lm, settings))
                    start = next(e for e in events if isinstance(e, RunStarted))
                    done = next(e for e in events if isinstance(e, RunFinished))
                    output = [e.token_id for e in events if isinstance(e, TokenStep)]
                    kls += [e.kl for e in events if isinstance(e, WatermarkStep) and e.kl is not None]
                    try:
                        rows[kind].append(detect_text(lm, g, done.text).z_score)
                    except DetectionError:
                        continue
                    ppl[kind].append(perplexity(lm, list(start.prompt_token_ids), output))
            out = {"scheme": scheme, "sampler": label, "runs": seeds, "new_tokens": args.new_tokens,
                   "threshold": g.z_threshold}
            for kind, zs in rows.items():
                out[f"{kind}_z_median"] = round(statistics.median(zs), 2)
                out[f"{kind}_z_range"] = [round(min(zs), 2), round(max(zs), 2)]
                out[f"{kind}_detected"] = round(sum(z > g.z_threshold for z in zs) / len(zs), 3)
                out[f"{kind}_perplexity"] = round(statistics.median(ppl[kind]), 2)
            out["mean_kl_nats"] = round(statistics.fmean(kls), 4) if kls else None
            print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
