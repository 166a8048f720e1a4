"""Caches that keep less at a ~2,000-token context, against DynamicCache, side by side in one run: decode tokens/s
and the bytes each holds (sinks + window, H2O, KIVI int4 / int2, per-token int4), and the attention recording's
cost per decode step (the attention view's --record-attention) against a plain step (goal: at most 1.3×).

The prompt is the kv-long-context preset's (the shipped calibration texts). Every cache reads it in one pass, then
decodes ``--new-tokens`` greedy tokens (EOS ignored); decode time excludes the prefill. Runs alternate in one
process (rounds of every configuration) so machine noise hits all; the median per configuration is reported with its
ratio to DynamicCache. The machine may be shared: only the ratios of one run mean anything.

    .venv/bin/python benchmarks/bench_kv_compress.py [--tiny] [--new-tokens 32] [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from contextlib import nullcontext

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import support_path  # noqa: F401  (tests/support on sys.path)
import torch
from transformers import DynamicCache

from playground.config import ModelSettings
from playground.engine.kv.attention_record import attention_row
from playground.engine.kv.attention_tap import AttentionTap, tapped
from playground.engine.kv.compressed import evicting_cache, kivi_cache
from playground.engine.kv.quantized import QuantizedKVCache
from playground.engine.kv_cache import kv_cache_bytes
from playground.engine.prompt import encode_prompt
from playground.models.loaded import LoadedModel
from playground.presets import load_preset


def load(tiny: bool) -> LoadedModel:
    if tiny:
        from support.tiny_models import build_tiny_lm

        return build_tiny_lm(seed=0, max_positions=8192)
    from playground.models.default_model import fetch_default_model
    from playground.models.loading import load_model

    fetch_default_model()
    return load_model(ModelSettings(device="cpu", dtype="float32"))


def held_bytes(cache: object) -> int:
    return int(getattr(cache, "nbytes", None) or kv_cache_bytes(cache))


@torch.inference_mode()
def decode(lm: LoadedModel, prompt_ids: list[int], new_tokens: int, cache: object, tap: AttentionTap | None
           ) -> tuple[float, int]:
    """(decode ms per step, bytes held at the end); with ``tap``, each step's rows are taken and made into the
    attention view's event, as the kv-cache run does."""
    model = lm.model
    with tapped(model, tap) if tap is not None else nullcontext():
        logits = model(input_ids=torch.tensor([prompt_ids]), cache=cache, use_cache=True).logits[:, -1]
        if tap is not None:
            tap.take()
        token, length = int(logits.argmax(-1)), len(prompt_ids)
        start = time.perf_counter()
        for step in range(new_tokens):
            logits = model(input_ids=torch.tensor([[token]]), cache=cache, use_cache=True).logits[:, -1]
            length += 1
            if tap is not None and tap.record:
                attention_row(step, tap.take(), cache, length, 16, model.config.num_key_value_heads)
            token = int(logits.argmax(-1))
        seconds = time.perf_counter() - start
    return seconds * 1000 / new_tokens, held_bytes(cache)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="a tiny random model built in memory (no download)")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    lm = load(args.tiny)
    config = lm.model.config
    prompt_ids, _ = encode_prompt(lm, load_preset("kv-long-context").settings)
    Make = Callable[[], tuple[object, AttentionTap | None]]

    def h2o() -> tuple[object, AttentionTap]:
        cache = evicting_cache(config, "h2o", 0, 128, 512)
        tap = AttentionTap(all_rows=True, record=False)
        tap.consumers.append(cache.observe)
        return cache, tap

    configs: dict[str, Make] = {
        "DynamicCache (full)": lambda: (DynamicCache(config=config), None),
        "sinks 4 + window 508": lambda: (evicting_cache(config, "sinks", 4, 508, 0), None),
        "H2O budget 512, window 128": h2o,
        "KIVI int4 (group 32, residual 32)": lambda: (kivi_cache(config, "int4", 32, 32), None),
        "KIVI int2 (group 32, residual 32)": lambda: (kivi_cache(config, "int2", 32, 32), None),
        "per-token int4": lambda: (QuantizedKVCache(config, kv_dtype="int4"), None),
        "full + attention recorded": lambda: (DynamicCache(config=config), AttentionTap(record=True)),
    }
    decode(lm, prompt_ids[:64], 2, DynamicCache(config=config), None)  # warm-up
    ms: dict[str, list[float]] = {name: [] for name in configs}
    held: dict[str, int] = {}
    for _ in range(args.repeats):
        for name, make in configs.items():
            cache, tap = make()
            step_ms, held[name] = decode(lm, prompt_ids, args.new_tokens, cache, tap)
            ms[name].append(step_ms)

    base = "DynamicCache (full)"
    base_ms, base_bytes = statistics.median(ms[base]), held[base]
    print(f"{len(prompt_ids)}-token prompt + {args.new_tokens} new tokens, {args.repeats} rounds, "
          f"{torch.get_num_threads()} threads (a shared machine: read the ratios)")
    print(f"{'cache':36} {'ms/step':>8} {'tok/s':>7} {'speed':>7} {'MB held':>8} {'bytes':>7}")
    for name in configs:
        step = statistics.median(ms[name])
        print(f"{name:36} {step:8.1f} {1000 / step:7.1f} {base_ms / step:6.2f}× {held[name] / 1e6:8.2f} "
              f"{held[name] / base_bytes:6.2f}×")
    recorded = statistics.median(ms["full + attention recorded"])
    print(f"attention recording: {recorded / base_ms:.2f}× a plain step (goal ≤ 1.3×)")


if __name__ == "__main__":
    main()
