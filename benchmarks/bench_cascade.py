"""Cascade inference on the default model: the full model alone vs the cascade at three thresholds, side by side in
one process on the same prompts; and, first, what each cheap model costs per token and how often it agrees.

1. Cheap models: each one decodes alone (a cascade with threshold 0 never calls the full model): tokens/s, its
   top-1 agreement with the full model's greedy output, and how often its *confident* tokens (p >= 0.5 along the
   full model's own output, teacher-forced) agree: what a cascade with it can hope for.
2. The cascade (the default cheap model) at three thresholds per token, and one per response, against the full model
   alone (plain greedy): tokens/s with the prompt included (prefill + decode: a cascade reads the full model's
   prompt lazily, at its first escalation) and decode-only, the share of tokens the full model produced, its passes,
   and agreement with the full model alone.

Speeds are total tokens / total time over prompts x repeats, configurations alternating within every prompt (this
machine is shared: only ratios within one run mean anything).

    .venv/bin/python benchmarks/bench_cascade.py [--new-tokens 64] [--repeats 2] [--thresholds 0.25,0.5,0.75]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass, field

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from playground.config import CascadeSettings, ModelSettings, RunSettings
from playground.engine.cascade.models import make_cheap_model
from playground.engine.prompt import encode_prompt
from playground.engine.strategies import run_strategy
from playground.events import RunFinished, RunStarted
from playground.models.default_model import fetch_default_model
from playground.models.loading import load_model

PROMPTS = [
    "Explain how a rainbow forms.",
    "Write a short story about a dragon who learns to bake bread.",
    "Give three tips for learning a new language.",
]
CHEAP_MODELS = [("quantized rtn-int4-head", {"cheap": "quantized", "cheap_quant": "rtn-int4-head"}),
                ("quantized rtn-int4", {"cheap": "quantized", "cheap_quant": "rtn-int4"}),
                ("quantized rtn-int8", {"cheap": "quantized", "cheap_quant": "rtn-int8"}),
                ("layers 20 of 30", {"cheap": "layers", "cheap_layers": 20}),
                ("layers 27 of 30", {"cheap": "layers", "cheap_layers": 27})]


@dataclass
class Result:
    prompt: int
    tokens: list[int]
    finished: RunFinished


@dataclass
class Config:
    label: str
    flat: dict
    results: list[Result] = field(default_factory=list)

    def speed(self, prompt: bool = True) -> float:
        """Tokens per second over all runs: total tokens / total time (a per-response cascade is bimodal, kept or
        rewritten: a median would hide the rewrites' cost), prompt included or decode only."""
        ms = sum(r.finished.decode_ms + (r.finished.prefill_ms if prompt else 0.0) for r in self.results)
        return sum(len(r.tokens) for r in self.results) / (ms / 1000)


def run(lm, prompt: str, new_tokens: int, flat: dict) -> tuple[list[int], RunFinished]:
    settings = RunSettings.from_flat(prompt=prompt, max_new_tokens=new_tokens, **flat)
    events = list(run_strategy(lm, settings))
    assert isinstance(events[0], RunStarted) and isinstance(events[-1], RunFinished)
    return list(events[-1].token_ids), events[-1]


def sweep(lm, configs: list[Config], new_tokens: int, repeats: int) -> None:
    for _ in range(repeats):
        for p, prompt in enumerate(PROMPTS):
            for config in configs:
                tokens, done = run(lm, prompt, new_tokens, config.flat)
                config.results.append(Result(p, tokens, done))


def agreement(tokens: list[int], reference: list[int]) -> tuple[float, int]:
    """Share of positions with the same token, and the first that differs (-1: none)."""
    same = [a == b for a, b in zip(tokens, reference, strict=False)]
    return sum(same) / max(len(same), 1), same.index(False) if False in same else -1


def confident_agreement(lm, cheap_flat: dict, full_outputs: list[list[int]], prompts_ids: list[list[int]],
                        confidence: float = 0.5) -> tuple[float, float]:
    """Teacher-forced on the full model's outputs: the share of positions where the cheap model's top token has
    p >= ``confidence``, and the share of those where it equals the full model's top token."""
    cheap = make_cheap_model(lm, CascadeSettings(**cheap_flat)).model
    confident = agree = total = 0
    with torch.inference_mode():
        for prompt_ids, output in zip(prompts_ids, full_outputs, strict=True):
            ids = torch.tensor([prompt_ids + output], device=lm.device)
            rows = slice(len(prompt_ids) - 1, ids.shape[1] - 1)
            full_top = lm.model(ids).logits[0, rows].argmax(-1)
            probs = cheap(ids).logits[0, rows].float().softmax(-1)
            top_p, top = probs.max(-1)
            sure = top_p >= confidence
            total += len(output)
            confident += int(sure.sum())
            agree += int((sure & (top == full_top)).sum())
    return confident / total, agree / confident if confident else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--thresholds", default="0.25,0.5,0.75")
    args = parser.parse_args()
    thresholds = [float(t) for t in args.thresholds.split(",")]
    start = time.perf_counter()
    fetch_default_model()
    lm = load_model(ModelSettings(device="cpu", dtype="float32"))
    print(f"{lm.name} fp32 on {lm.device}, {torch.get_num_threads()} threads, "
          f"OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}; {len(PROMPTS)} prompts x {args.repeats} repeats, "
          f"{args.new_tokens} new tokens, chat template")

    full = Config("full model alone (greedy)", {"strategy": "greedy"})
    cheap_configs = [Config(label, {"strategy": "cascade", "cascade_threshold": 0.0, "cascade_compare": False,
                                    **flat}) for label, flat in CHEAP_MODELS]
    for config in [full, *cheap_configs]:  # warm-up: build every cheap model, touch every path
        run(lm, PROMPTS[0], 4, config.flat)
    sweep(lm, [full, *cheap_configs], args.new_tokens, args.repeats)
    references = {r.prompt: r.tokens for r in full.results}
    prompts_ids = [encode_prompt(lm, RunSettings(prompt=prompt))[0] for prompt in PROMPTS]
    full_outputs = [references[p] for p in range(len(PROMPTS))]

    print("\n== 1. Cheap models alone (a cascade at threshold 0): speed and agreement with the full model")
    print(f"  {'cheap model':<26} {'tok/s':>6} {'x full':>7} {'ident':>6} {'1st div':>9} {'p>=.5':>6} "
          f"{'agree':>6}")
    full_speed = full.speed()
    print(f"  {'(full model alone)':<26} {full_speed:6.1f} {1.0:6.2f}x")
    for config, (_, flat) in zip(cheap_configs, CHEAP_MODELS, strict=True):
        speed = config.speed()
        pairs = [agreement(r.tokens, references[r.prompt]) for r in config.results[: len(PROMPTS)]]
        identical = statistics.fmean(a for a, _ in pairs)
        sure, sure_agree = confident_agreement(lm, flat, full_outputs, prompts_ids)
        print(f"  {config.label:<26} {speed:6.1f} {speed / full_speed:6.2f}x {identical:6.3f} "
              f"{','.join(str(d) for _, d in pairs):>9} {sure:6.2f} {sure_agree:6.3f}")
    print("  tok/s: prompt included, total tokens / total time; ident: share of tokens equal to the full "
          "model's greedy output (mean over prompts); 1st div: first differing position per prompt; p>=.5: share "
          "of the full model's output positions where the cheap model is that sure (teacher-forced); agree: share "
          "of those where its top token is the full model's")

    cascades = [Config(f"cascade per token, p < {t:g}", {"strategy": "cascade", "cascade_threshold": t,
                                                         "cascade_compare": False}) for t in thresholds]
    middle = thresholds[len(thresholds) // 2]
    cascades.append(Config(f"cascade per response, mean < {middle:g}",
                           {"strategy": "cascade", "cascade_threshold": middle, "cascade_unit": "response",
                            "cascade_compare": False}))
    full.results.clear()
    sweep(lm, [full, *cascades], args.new_tokens, args.repeats)
    references = {r.prompt: r.tokens for r in full.results}
    default = CascadeSettings()
    cheap_label = f"{default.cheap} {default.cheap_quant}" if default.cheap == "quantized" else default.cheap
    print(f"\n== 2. Side by side: the full model alone vs the cascade (the default cheap model, {cheap_label}, "
          "first)")
    print(f"  {'configuration':<34} {'tok/s':>6} {'x full':>7} {'decode':>7} {'full %':>7} {'esc':>5} "
          f"{'passes':>6} {'ident':>6} {'1st div':>9}")
    full_speed = full.speed()
    full_decode = full.speed(prompt=False)
    print(f"  {full.label:<34} {full_speed:6.1f} {1.0:6.2f}x {full_decode:7.1f} {'100':>7} {'':>5} "
          f"{statistics.fmean(len(r.tokens) for r in full.results):6.1f}")
    for config in cascades:
        speed = config.speed()
        pairs = [agreement(r.tokens, references[r.prompt]) for r in config.results[: len(PROMPTS)]]
        share = statistics.fmean(r.finished.figures["full_share"] for r in config.results)
        escalations = statistics.fmean(r.finished.figures["escalations"] for r in config.results)
        passes = statistics.fmean(r.finished.figures["full_passes"] for r in config.results)
        print(f"  {config.label:<34} {speed:6.1f} {speed / full_speed:6.2f}x "
              f"{config.speed(prompt=False):7.1f} {100 * share:6.1f}% {escalations:5.1f} "
              f"{passes:6.1f} {statistics.fmean(a for a, _ in pairs):6.3f} "
              f"{','.join(str(d) for _, d in pairs):>9}")
    print("  tok/s: prompt included (the fair figure: the cascade reads the full model's prompt at its first "
          "escalation), total tokens / total time over the runs; x full: against the full model alone; decode: "
          "the same with the prompt excluded (plain greedy's first token comes free with its prefill); full %: "
          "share of output tokens the full model produced (mean); esc: escalations (stretches of full-model "
          "tokens) per run; passes: full-model passes per run (plain greedy: one per token); ident / 1st div: "
          "agreement with the full model alone")
    print(f"\ntotal {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
