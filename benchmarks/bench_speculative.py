"""Speculative decoding on the default model: plain greedy vs each drafter, and transformers' own prompt lookup and
early-exit assisted generation, side by side in one process on the same prompts.

Every configuration decodes the same prompts greedily (so every output must be identical to plain greedy: the
script checks it); runs alternate across configurations and the median over repeats is reported, with tokens/s
ratios against our plain greedy and our acceptance figures.

    .venv/bin/python benchmarks/bench_speculative.py [--new-tokens 64] [--repeats 3] [--k 10] [--layers 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from playground.config import ModelSettings, RunSettings
from playground.engine.prompt import encode_prompt
from playground.engine.strategies import run_strategy
from playground.events import RunFinished
from playground.models.default_model import fetch_default_model
from playground.models.loading import load_model

PASSAGE = ("The lighthouse keeper climbed the spiral stairs every evening at dusk. He trimmed the wick, polished "
           "the great lens, and wrote the weather in a leather book: wind from the west, light rain, a fishing boat "
           "returning late. In forty years the light had never failed, and the villagers said that ships could "
           "find the harbour by the keeper's lamp alone.")
GROUNDED = [
    f"Repeat the following text exactly, word for word:\n\n{PASSAGE}",
    f"Fix the punctuation of this text and write it out again:\n\n{PASSAGE.replace(',', '').replace('.', '')}",
    f"Summarise this text in two sentences, reusing its words:\n\n{PASSAGE}",
]
OPEN_ENDED = ["Write a short story about a dragon who learns to bake bread.", "Explain how a rainbow forms."]


def ours(lm, prompt: str, new_tokens: int, **spec) -> tuple[list[int], float, dict]:
    settings = RunSettings.from_flat(prompt=prompt, max_new_tokens=new_tokens, baseline_tokens=0, **spec)
    start = time.perf_counter()
    done = next(e for e in run_strategy(lm, settings) if isinstance(e, RunFinished))
    return list(done.token_ids), time.perf_counter() - start, done.figures


def transformers_generate(lm, prompt: str, new_tokens: int, **kwargs) -> tuple[list[int], float, dict]:
    ids, _ = encode_prompt(lm, RunSettings(prompt=prompt))
    ids_t = torch.tensor([ids], device=lm.device)
    start = time.perf_counter()
    out = lm.model.generate(ids_t, attention_mask=torch.ones_like(ids_t), do_sample=False,
                            max_new_tokens=new_tokens, **kwargs)
    return out[0, len(ids):].tolist(), time.perf_counter() - start, {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--k", type=int, default=10, help="drafted tokens per round (transformers' default is 10)")
    parser.add_argument("--layers", type=int, default=10, help="draft layers for the self-drafting configurations")
    args = parser.parse_args()
    fetch_default_model()
    lm = load_model(ModelSettings(device="cpu", dtype="float32"))
    k, n = args.k, args.new_tokens
    configs = {
        "ours: plain greedy": lambda p: ours(lm, p, n),
        f"ours: prompt lookup k={k}": lambda p: ours(lm, p, n, strategy="speculative", draft="prompt-lookup",
                                                     draft_k=k, prompt_lookup_ngram=2),
        f"ours: prompt lookup adaptive k={k}": lambda p: ours(lm, p, n, strategy="speculative",
                                                              draft="prompt-lookup", draft_k=k, adaptive_k=True,
                                                              prompt_lookup_ngram=2),
        f"ours: first {args.layers} layers k=4": lambda p: ours(lm, p, n, strategy="speculative", draft="layers",
                                                                draft_k=4, draft_layers=args.layers),
        "ours: quantized int4 copy k=4": lambda p: ours(lm, p, n, strategy="speculative", draft="quantized",
                                                        draft_quant="rtn-int4", draft_k=4),
        f"ours: jacobi k={k}": lambda p: ours(lm, p, n, strategy="speculative", draft="jacobi", draft_k=k),
        "transformers: greedy": lambda p: transformers_generate(lm, p, n),
        f"transformers: prompt lookup {k}": lambda p: transformers_generate(lm, p, n, prompt_lookup_num_tokens=k),
        f"transformers: early exit {args.layers}": lambda p: transformers_generate(
            lm, p, n, assistant_early_exit=args.layers),
    }
    for name, prompts in (("grounded", GROUNDED), ("open-ended", OPEN_ENDED)):
        rates: dict[str, list[float]] = {c: [] for c in configs}
        figures: dict[str, list[dict]] = {c: [] for c in configs}
        for fn in configs.values():  # warm-up
            fn(prompts[0][:200])
        for _ in range(args.repeats):
            for prompt in prompts:
                reference = None
                for config, fn in configs.items():
                    tokens, seconds, figs = fn(prompt)
                    if reference is None:
                        reference = tokens
                    assert tokens == reference, f"{config} changed the greedy output on {prompt[:40]!r}"
                    rates[config].append(len(tokens) / seconds)
                    figures[config].append(figs)
        base = statistics.median(rates["ours: plain greedy"])
        print(f"\n{name} prompts ({len(prompts)}), {n} new tokens, median of {args.repeats} x {len(prompts)} runs, "
              f"{lm.name} fp32 on {lm.device}; every output identical to plain greedy")
        for config in configs:
            median = statistics.median(rates[config])
            accept = [f["acceptance_rate"] for f in figures[config] if f]
            mean_acc = [f["mean_accepted"] for f in figures[config] if f]
            extra = (f"   acceptance {statistics.mean(accept):.2f}, mean accepted {statistics.mean(mean_acc):.2f}"
                     if accept else "")
            print(f"  {config:<34} {median:6.1f} tok/s  {median / base:5.2f}x ours greedy{extra}")


if __name__ == "__main__":
    main()
