"""Bare `model.generate` greedy vs the playground's instrumented greedy, side by side in one process.

Same model, device, prompt and 128 new tokens; runs alternate (A, B, A, B, ...) so machine noise hits both,
and the median of each is reported with the ratio. Wall time includes prefill for both.

    .venv/bin/python benchmarks/bench_greedy.py [--model PATH] [--device cpu] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from side_by_side import report

from playground.config import ModelSettings, RunSettings
from playground.engine.strategies import run_strategy
from playground.events import RunFinished
from playground.models.default_model import fetch_default_model
from playground.models.loading import load_model

PROMPT = "Write a long story about a dragon who learns to bake bread."


def bare_generate(lm, prompt_ids: list[int], new_tokens: int) -> tuple[int, float]:
    ids = torch.tensor([prompt_ids], device=lm.device)
    start = time.perf_counter()
    out = lm.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new_tokens)
    return out.shape[1] - ids.shape[1], time.perf_counter() - start


def instrumented(lm, settings: RunSettings) -> tuple[int, float]:
    start = time.perf_counter()
    done = next(e for e in run_strategy(lm, settings) if isinstance(e, RunFinished))
    return len(done.token_ids), time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.model is None:
        fetch_default_model()
    lm = load_model(ModelSettings(path=args.model, device=args.device, dtype=args.dtype))
    settings = RunSettings(prompt=PROMPT, max_new_tokens=args.new_tokens)
    first = next(iter(run_strategy(lm, settings)))
    prompt_ids = list(first.prompt_token_ids)
    instrumented(lm, settings.replace(max_new_tokens=4))  # warm-up both paths
    bare_generate(lm, prompt_ids, 4)

    bare, ours = [], []
    for _ in range(args.repeats):
        n, seconds = bare_generate(lm, prompt_ids, args.new_tokens)
        bare.append(n / seconds)
        n_ours, seconds = instrumented(lm, settings)
        ours.append(n_ours / seconds)
        assert n_ours == n, f"both should generate the same tokens ({n} vs {n_ours})"
    report(f"model {lm.name} on {lm.device} ({lm.dtype_name}), prompt {len(prompt_ids)} tokens, {n} new tokens, "
           f"median of {args.repeats}", "tok/s", ("bare model.generate greedy", bare),
           ("playground instrumented greedy", ours), goal=0.9)

if __name__ == "__main__":
    main()
