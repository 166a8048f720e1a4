"""Contiguous (DynamicCache) vs paged vs quantized KV caches: greedy decode speed, bytes held, where outputs diverge.

Same model, prompt and new-token count for every cache (EOS ignored, so every run decodes the same number of
tokens); runs alternate (contiguous, paged, int8, int4, contiguous, ...) in one process so machine noise hits all,
and the median of each is reported with its ratio to the contiguous cache (goal for paged: >= 0.9x). Wall time
includes the prefill. Bytes are what each cache holds at the end (paged: the blocks sequences hold, and the pool
reserved). The quantized caches' greedy tokens are compared with the contiguous cache's: the first step where they
differ, and (teacher-forced on the contiguous cache's tokens) how many steps pick the same top-1 token and the
largest logit difference.

    .venv/bin/python benchmarks/bench_kv_paged.py [--tiny] [--new-tokens 128] [--repeats 3] [--block-size 16]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import support_path  # noqa: F401  (tests/support on sys.path)
import torch
from transformers import DynamicCache

from playground.config import ModelSettings, RunSettings
from playground.engine.kv.paged import PagedCache
from playground.engine.kv.quantized import QuantizedKVCache
from playground.engine.kv_cache import kv_cache_bytes
from playground.engine.prompt import encode_prompt
from playground.models.loaded import LoadedModel

PROMPT = "Write a long story about a dragon who learns to bake bread."
NewCache = Callable[[], object]


def load(tiny: bool) -> LoadedModel:
    if tiny:
        from support.tiny_models import build_tiny_lm

        return build_tiny_lm(seed=0)
    from playground.models.default_model import fetch_default_model
    from playground.models.loading import load_model

    fetch_default_model()
    return load_model(ModelSettings(device="cpu", dtype="float32"))


@torch.inference_mode()
def greedy(lm: LoadedModel, prompt_ids: list[int], new_tokens: int, cache: object,
           forced: list[int] | None = None) -> tuple[list[int], torch.Tensor, float]:
    """(tokens, logits [new_tokens, vocab], seconds); ``forced``: feed these tokens instead of the argmax."""
    ids = torch.tensor([prompt_ids], device=lm.device)
    start = time.perf_counter()
    logits = lm.model(input_ids=ids, cache=cache, use_cache=True).logits[:, -1]  # [1, vocab]
    tokens, rows = [], [logits]
    for step in range(new_tokens):
        token = int(logits.argmax(-1)) if forced is None else forced[step]
        tokens.append(token)
        if step + 1 < new_tokens:
            logits = lm.model(input_ids=torch.tensor([[token]], device=lm.device), cache=cache,
                              use_cache=True).logits[:, -1]
            rows.append(logits)
    seconds = time.perf_counter() - start
    return tokens, torch.cat(rows).float(), seconds


def held_bytes(cache: object) -> int:
    return int(getattr(cache, "nbytes", None) or kv_cache_bytes(cache))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="a tiny random model built in memory (no download)")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--block-size", type=int, default=16)
    args = parser.parse_args()

    lm = load(args.tiny)
    config = lm.model.config
    prompt_ids, _ = encode_prompt(lm, RunSettings(prompt=PROMPT))
    caches: dict[str, NewCache] = {
        "contiguous (DynamicCache)": lambda: DynamicCache(config=config),
        f"paged, {args.block_size}-token blocks": lambda: PagedCache(config, block_size=args.block_size),
        "quantized int8": lambda: QuantizedKVCache(config, kv_dtype="int8"),
        "quantized int4-per-token": lambda: QuantizedKVCache(config, kv_dtype="int4"),
    }
    for make in caches.values():  # warm-up
        greedy(lm, prompt_ids, 4, make())

    rates: dict[str, list[float]] = {name: [] for name in caches}
    tokens: dict[str, list[int]] = {}
    ends: dict[str, object] = {}
    for _ in range(args.repeats):
        for name, make in caches.items():
            cache = make()
            out, _, seconds = greedy(lm, prompt_ids, args.new_tokens, cache)
            rates[name].append(args.new_tokens / seconds)
            assert tokens.setdefault(name, out) == out, f"{name}: greedy changed between repeats"
            ends[name] = cache

    names = list(caches)
    reference = tokens[names[0]]
    _, ref_logits, _ = greedy(lm, prompt_ids, args.new_tokens, caches[names[0]](), forced=reference)
    base = statistics.median(rates[names[0]])
    print(f"model {lm.name} on {lm.device} ({lm.dtype_name}), prompt {len(prompt_ids)} tokens, {args.new_tokens} new "
          f"tokens (EOS ignored), median of {args.repeats}, {torch.get_num_threads()} threads")
    print(f"{'cache':<28} {'tok/s':>7} {'ratio':>6} {'KiB held':>9} {'B/token':>8} {'first diff':>10} "
          f"{'top-1 same':>10} {'max |dlogit|':>12}   runs")
    positions = len(prompt_ids) + args.new_tokens - 1  # the last token is never fed back
    for name in names:
        median, cache = statistics.median(rates[name]), ends[name]
        diff = next((i for i, (a, b) in enumerate(zip(reference, tokens[name], strict=True)) if a != b), None)
        _, logits, _ = greedy(lm, prompt_ids, args.new_tokens, caches[name](), forced=reference)
        same = int((logits.argmax(-1) == ref_logits.argmax(-1)).sum())
        delta = float((logits - ref_logits).abs().max())
        print(f"{name:<28} {median:7.1f} {median / base:5.2f}x {held_bytes(cache) / 1024:9.1f} "
              f"{held_bytes(cache) / positions:8.0f} {'none' if diff is None else f'step {diff}':>10} "
              f"{same:>5}/{args.new_tokens:<4} {delta:12.4f}   {', '.join(f'{r:.1f}' for r in rates[name])}")
        if isinstance(cache, PagedCache):
            blocks = cache.blocks()
            print(f"{'':<28} {blocks.blocks_allocated} blocks, {blocks.slots_used}/{blocks.slots_allocated} slots "
                  f"used (fragmentation {blocks.fragmentation:.3f}), pool reserved {cache.reserved_bytes / 1024:.1f} "
                  f"KiB")
    print(f"goal: paged >= 0.90x contiguous; KV positions held at the end: {positions}")


if __name__ == "__main__":
    main()
