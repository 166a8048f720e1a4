"""Contrastive search: ours against transformers 4.46's ``generate(penalty_alpha=α, top_k=k)`` on the default model,
same prompts, same settings, float32 on the CPU, one thread each.

The 4.46 side runs in the other venv (``--venv446``, default /work/venv446) as a subprocess: this file again, with
``--side 446``, which imports only torch and transformers. Each side loads the model once, warms up on one short
run, then decodes every prompt ``--repeats`` times; the figure is wall-clock milliseconds per generated token of
the whole call (prefill included), the median over runs. The tokens of both sides are compared too.

    .venv/bin/python benchmarks/bench_contrastive_search.py [--new-tokens 32] [--repeats 2] [--alpha 0.6] [--k 4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

PROMPTS = [
    "Once upon a time, there was a little robot who",
    "The best way to learn a new language is",
    "I like apples. I like",
]
FOLDER = Path.home() / ".cache" / "decoding-playground" / "models" / "SmolLM2-135M-Instruct"


def side_446(args: argparse.Namespace) -> dict:
    """transformers 4.46's contrastive search (rope_theta set by hand: 4.46 does not read a 5.x config's)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.set_num_threads(1)
    config = LlamaConfig.from_pretrained(FOLDER)
    config.rope_theta = json.loads((FOLDER / "config.json").read_text())["rope_parameters"]["rope_theta"]
    model = LlamaForCausalLM.from_pretrained(FOLDER, config=config, torch_dtype=torch.float32).eval()
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(FOLDER / "tokenizer.json"), eos_token="<|im_end|>")

    def generate(prompt: str, tokens: int) -> tuple[list[int], float]:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), penalty_alpha=args.alpha, top_k=args.k,
                                 max_new_tokens=tokens, pad_token_id=tokenizer.eos_token_id, temperature=None,
                                 top_p=None)
        return out[0, ids.shape[1]:].tolist(), time.perf_counter() - start

    return measure(generate, args)


def side_ours(args: argparse.Namespace) -> dict:
    import torch

    from playground.config import ModelSettings, RunSettings
    from playground.engine.strategies import run_strategy
    from playground.models.loading import load_model

    torch.set_num_threads(1)
    lm = load_model(ModelSettings(path=str(FOLDER), device="cpu", dtype="float32"))

    def generate(prompt: str, tokens: int) -> tuple[list[int], float]:
        settings = RunSettings.from_flat(strategy="contrastive-search", prompt=prompt, chat=False,
                                         max_new_tokens=tokens, top_k=args.k, penalty_alpha=args.alpha)
        start = time.perf_counter()
        events = list(run_strategy(lm, settings))
        return list(events[-1].token_ids), time.perf_counter() - start

    return measure(generate, args)


def measure(generate, args: argparse.Namespace) -> dict:
    generate(PROMPTS[0], 4)  # warm-up
    found: dict = {"ms_per_token": [], "ids": {}}
    for _ in range(args.repeats):
        for prompt in PROMPTS:
            ids, seconds = generate(prompt, args.new_tokens)
            found["ms_per_token"].append(seconds * 1000 / max(len(ids), 1))
            found["ids"][prompt] = ids
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--alpha", type=float, default=0.6)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--venv446", default="/work/venv446")
    parser.add_argument("--side", choices=("both", "446"), default="both")
    args = parser.parse_args()
    if args.side == "446":
        print(json.dumps(side_446(args)))
        return
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [str(Path(args.venv446) / "bin" / "python"), __file__, "--side", "446", "--new-tokens",
               str(args.new_tokens), "--repeats", str(args.repeats), "--alpha", str(args.alpha), "--k", str(args.k)]
    theirs = json.loads(subprocess.run(command, check=True, capture_output=True, text=True, env=env
                                       ).stdout.strip().splitlines()[-1])
    ours = side_ours(args)
    a, b = statistics.median(ours["ms_per_token"]), statistics.median(theirs["ms_per_token"])
    same = sum(ours["ids"][p] == theirs["ids"][p] for p in PROMPTS)
    print(f"contrastive search, α = {args.alpha:g}, k = {args.k}, {args.new_tokens} new tokens, {len(PROMPTS)} "
          f"prompts × {args.repeats}, SmolLM2-135M float32 CPU, 1 thread")
    print(f"  ours             {a:7.1f} ms/token")
    print(f"  transformers 4.46 {b:6.1f} ms/token")
    print(f"  ours / 4.46      {a / b:7.2f}×   (identical tokens on {same} of {len(PROMPTS)} prompts)")


if __name__ == "__main__":
    sys.exit(main())
