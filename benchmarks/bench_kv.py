"""The KV cache on the default model, measured in one process: what it saves, what batching buys, what the
attention kernel costs, and where prefill and decode sit against this machine's measured ceilings.

1. With vs without the cache: per-token latency as the sequence grows (39- and 200-token prompts, 128 new tokens;
   medians over 8-step windows, ratio per point, and the ratio of the whole 128 tokens).
2. Prefill and decode on the roofline: estimated FLOPs and bytes (``phase_estimate``), intensity, achieved FLOP/s
   and bytes/s against the ceilings (matmul and copy probes, cached per machine in the user cache).
3. Batch sweep: N copies of a prompt as one batch, N = 1..32: step latency, throughput, cache size; every row's
   tokens checked against single-prompt greedy, and a batch of 8 different left-padded prompts checked the same way.
4. Attention implementations on a ~1000-token prefill: time, peak memory, agreement of the logits.

Machines here are shared: only ratios within one run mean much.

    .venv/bin/python benchmarks/bench_kv.py [--new-tokens 128] [--sweep-tokens 24] [--sizes 1,2,4,8,16,32]
        [--attn-len 1000] [--attn-repeats 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from playground.config import ModelSettings
from playground.engine.kv import batch, measure
from playground.engine.kv_cache import kv_bytes_per_token
from playground.models.default_model import fetch_default_model
from playground.models.loading import load_model

PASSAGE = (
    "The lighthouse keeper climbed the spiral stairs every evening at dusk. He trimmed the wick, polished the great "
    "lens, and wrote the weather in a leather book. Ships passed in the night, their lanterns small against the "
    "dark water, and the keeper counted them as other men count sheep. In winter the storms came from the north and "
    "the tower shook; in summer the fog rolled in so thick that the beam seemed to stop an arm's length from the "
    "glass. He had a cat, a kettle, a shelf of books about the stars, and a radio that only ever found one station. "
)


def mib(n: float) -> str:
    return f"{n / 2**20:8.2f} MiB"


def window_median(values: list[float], centre: int, half: int = 4) -> float:
    return statistics.median(values[max(0, centre - half): centre + half])


def with_and_without(lm, prompt: list[int], new_tokens: int) -> tuple[list[float], list[float]]:
    cached, cached_ms = batch.cached_decode(lm, prompt, new_tokens)
    uncached, uncached_ms = batch.no_cache_decode(lm, prompt, new_tokens)
    print(f"\n  prompt {len(prompt)} tokens, {new_tokens} new; same tokens both ways: {cached == uncached}")
    print(f"  {'step':>5} {'seq len':>8} {'cached ms':>10} {'no cache ms':>12} {'ratio':>7}")
    for step in [0, *range(8, new_tokens, 16), new_tokens - 1]:
        c, u = (cached_ms[0], uncached_ms[0]) if step == 0 else (window_median(cached_ms[1:], step - 1),
                                                                 window_median(uncached_ms[1:], step - 1))
        print(f"  {step:>5} {len(prompt) + step:>8} {c:>10.1f} {u:>12.1f} {u / c:>6.2f}x")
    total_c, total_u = sum(cached_ms), sum(uncached_ms)
    print(f"  all {new_tokens} tokens: cached {total_c / 1000:.2f} s, no cache {total_u / 1000:.2f} s, "
          f"ratio {total_u / total_c:.2f}x (step 0 is the prompt pass in both)")
    return cached_ms, uncached_ms


def phase_line(lm, ceilings: measure.Ceilings, phase: str, tokens: int, before: int, ms: float) -> None:
    """One phase of ``tokens`` forward positions after ``before`` cached ones."""
    body, head = measure.forward_params(lm.model)
    element = torch.empty((), dtype=lm.dtype).element_size()
    flops, moved = measure.phase_estimate(lm.model.config, body, phase, tokens, before + tokens, element,
                                          kv_bytes_per_token(lm.model.config, lm.dtype), head_params=head)
    seconds = ms / 1000
    intensity = flops / moved
    roof = measure.attainable_flops(intensity, ceilings)
    print(f"  {phase:<8} {tokens:>5} tok after {before:>4} {ms:>9.1f} ms  {flops / 1e9:>8.1f} GFLOP "
          f"{moved / 1e9:>7.2f} GB  intensity {intensity:>7.1f} FLOP/B  achieved {flops / seconds / 1e9:>6.1f} GFLOP/s "
          f"{moved / seconds / 1e9:>5.1f} GB/s  roofline {roof / 1e9:>6.1f} GFLOP/s ({flops / seconds / roof:.0%})")


def sweep(lm, prompt: list[int], sizes: list[int], new_tokens: int, mixed: list[list[int]]) -> None:
    single, _ = batch.cached_decode(lm, prompt, new_tokens)
    print(f"\n  prompt {len(prompt)} tokens, {new_tokens} new tokens per row; ms/step = median step after the prefill")
    print(f"  {'N':>3} {'ms/step':>9} {'tok/s':>8} {'vs N=1':>7} {'KV cache':>13} {'rows = single':>14}")
    base = None
    for size in sizes:
        run = batch.batch_greedy(lm, [prompt] * size, new_tokens)
        ms = statistics.median(run.step_ms)
        rate = size * 1000 / ms
        base = base or rate
        print(f"  {size:>3} {ms:>9.1f} {rate:>8.1f} {rate / base:>6.2f}x {mib(run.kv_bytes):>13} "
              f"{all(row == single for row in run.tokens)!s:>14}")
    singles = [batch.cached_decode(lm, p, new_tokens)[0] for p in mixed]
    run = batch.batch_greedy(lm, mixed, new_tokens)
    ms = statistics.median(run.step_ms)
    same = sum(row == one for row, one in zip(run.tokens, singles, strict=True))
    print(f"  {len(mixed)} different prompts ({min(map(len, mixed))}-{max(map(len, mixed))} tokens, left-padded): "
          f"{ms:.1f} ms/step, {len(mixed) * 1000 / ms:.1f} tok/s, rows equal to single-prompt greedy: "
          f"{same}/{len(mixed)}")


def attention(lm, prompt: list[int], repeats: int) -> dict:
    result = batch.attention_compare(lm, len(prompt), repeats=repeats, prompt_ids=prompt)
    print(f"\n  prefill of {result['prompt_len']} tokens, {result['dtype']}; memory: {result['memory_measure']}")
    print(f"  {'implementation':<18} {'ms':>9} {'peak memory':>14} {'max |Δlogit|':>13}  runs")
    for name, v in result["variants"].items():
        if not v["available"]:
            print(f"  {name:<18} unavailable: {v['why']}")
            continue
        peak = mib(v["peak_bytes"]) if v["peak_bytes"] is not None else "n/a"
        print(f"  {name:<18} {v['ms']:>9.1f} {peak:>14} {v['max_logit_diff']:>13.2e}  "
              f"{', '.join(f'{x:.0f}' for x in v['runs_ms'])}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--sweep-tokens", type=int, default=24)
    parser.add_argument("--sizes", default="1,2,4,8,16,32")
    parser.add_argument("--attn-len", type=int, default=1000)
    parser.add_argument("--attn-repeats", type=int, default=2)
    args = parser.parse_args()
    started = time.perf_counter()
    fetch_default_model()
    lm = load_model(ModelSettings(device="cpu", dtype="float32"))
    text_ids = lm.tokenizer.encode(PASSAGE * 12)
    assert len(text_ids) >= args.attn_len, f"the passage gives {len(text_ids)} tokens"
    print(f"model {lm.name} on {lm.device} ({lm.dtype_name}), {torch.get_num_threads()} threads, torch "
          f"{torch.__version__}; weights {mib(measure.weights_bytes(lm.model))}, KV "
          f"{kv_bytes_per_token(lm.model.config, lm.dtype):,} B/token")

    ceilings = measure.machine_ceilings(lm.device, lm.dtype)
    fresh = measure.measure_ceilings(lm.device, lm.dtype)
    print(f"\n1. ceilings ({ceilings.source}): matmul {ceilings.peak_flops / 1e9:.1f} GFLOP/s, copy "
          f"{ceilings.peak_bytes_per_s / 1e9:.1f} GB/s (read + written); measured again now: "
          f"{fresh.peak_flops / 1e9:.1f} GFLOP/s, {fresh.peak_bytes_per_s / 1e9:.1f} GB/s")

    batch.cached_decode(lm, text_ids[:39], 8)  # warm-up
    print("\n2. per-token latency with and without the cache")
    runs = {n: with_and_without(lm, text_ids[:n], args.new_tokens) for n in (39, 200)}

    best = measure.Ceilings(max(ceilings.peak_flops, fresh.peak_flops),
                            max(ceilings.peak_bytes_per_s, fresh.peak_bytes_per_s))
    print("\n3. prefill and decode on the roofline (FLOPs and bytes estimated from the model's shape, times measured:"
          "\n   prefill = median of 3 prompt passes, decode = median step x steps; roofline from the higher of the two"
          "\n   ceiling measurements above)")
    for n, (cached_ms, _) in runs.items():
        prefill_ms = statistics.median(batch.cached_decode(lm, text_ids[:n], 1)[1][0] for _ in range(3))
        phase_line(lm, best, "prefill", n, 0, prefill_ms)
        phase_line(lm, best, "decode", len(cached_ms) - 1, n, statistics.median(cached_ms[1:]) * (len(cached_ms) - 1))

    print("\n4. batch sweep")
    mixed = [text_ids[7 * i: 7 * i + length] for i, length in enumerate((12, 20, 28, 36, 44, 52, 60, 68))]
    sweep(lm, text_ids[:39], [int(s) for s in args.sizes.split(",")], args.sweep_tokens, mixed)

    print("\n5. attention implementations")
    result = attention(lm, text_ids[:args.attn_len], args.attn_repeats)
    sdpa = result["variants"].get("sdpa", {})
    if sdpa.get("available"):
        phase_line(lm, best, "prefill", result["prompt_len"], 0, sdpa["ms"])
    print(f"\ntotal {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
