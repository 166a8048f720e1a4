"""The KV-cache measurements on a CUDA device, in well under five minutes: the ceilings, allocated and reserved
memory over a decode against the cache's measured bytes, SDPA vs FlashAttention (where present) on long prefills,
with vs without cache, and a short batch sweep.

Uses the default model when it is already fetched, else a random-weight model of the same shape (SmolLM2-135M:
timings and memory do not depend on the weights' values). On a machine without CUDA it says so and exits 0.

    python benchmarks/gpu_kv_check.py [--dtype bfloat16] [--prompt 512] [--new-tokens 512]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

SMOLLM2_SHAPE = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                     num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192, rope_theta=100000.0,
                     tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2)


def mib(n: float) -> str:
    return f"{n / 2**20:9.1f} MiB"


def load(dtype_name: str):
    from playground.config import ModelSettings
    from playground.models.default_model import is_default_model_ready
    from playground.models.loaded import LoadedModel
    from playground.models.loading import load_model

    if is_default_model_ready():
        return load_model(ModelSettings(device="cuda", dtype=dtype_name))
    from transformers import LlamaConfig, LlamaForCausalLM

    dtype = getattr(torch, dtype_name)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SMOLLM2_SHAPE)).to(device="cuda", dtype=dtype).eval()
    return LoadedModel(model=model, tokenizer=None, name="SmolLM2-135M shape, random weights", path="<memory>",
                       device=torch.device("cuda"), dtype=dtype)


def memory_over_decode(lm, prompt_len: int, new_tokens: int) -> None:
    from transformers import DynamicCache

    from playground.engine.kv import measure

    model, device = lm.model, lm.device
    ids = torch.randint(3, model.config.vocab_size, (1, prompt_len), device=device)  # [1, prompt_len]
    cache = DynamicCache(config=model.config)
    element = torch.empty((), dtype=lm.dtype).element_size()
    base_alloc, base_reserved = measure.process_memory(device)
    print(f"  before the prompt: allocated {mib(base_alloc)}, reserved {mib(base_reserved)} "
          f"(weights {mib(measure.weights_bytes(model))})")
    print(f"  {'step':>5} {'tokens':>7} {'KV measured':>13} {'KV formula':>13} {'allocated Δ':>13} {'reserved Δ':>13} "
          f"{'step ms':>8}")
    times: list[float] = []
    with torch.inference_mode():
        token = ids
        for step in range(new_tokens):
            torch.cuda.synchronize(device)
            start = time.perf_counter()
            logits = model(input_ids=token, cache=cache, use_cache=True, logits_to_keep=1).logits
            token = logits[:, -1:].argmax(-1)  # [1, 1]
            torch.cuda.synchronize(device)
            times.append((time.perf_counter() - start) * 1000)
            if step % max(1, new_tokens // 8) == 0 or step == new_tokens - 1:
                held = cache.get_seq_length()
                alloc, reserved = measure.process_memory(device)
                print(f"  {step:>5} {held:>7} {mib(sum(measure.layer_bytes(cache))):>13} "
                      f"{mib(measure.formula_bytes(model.config, held, element)):>13} {mib(alloc - base_alloc):>13} "
                      f"{mib(reserved - base_reserved):>13} {times[-1]:>8.2f}")
    print(f"  median decode step {statistics.median(times[1:]):.2f} ms (step 0 is the {prompt_len}-token prompt pass)")


def attention(lm, lengths: list[int]) -> None:
    from playground.engine.kv import batch

    for length in lengths:
        result = batch.attention_compare(lm, length, repeats=3)
        print(f"  prefill of {result['prompt_len']} tokens ({result['dtype']}); memory: {result['memory_measure']}")
        for name, v in result["variants"].items():
            if v["available"]:
                print(f"    {name:<18} {v['ms']:>9.2f} ms  peak {mib(v['peak_bytes'])}  max |Δlogit| "
                      f"{v['max_logit_diff']:.2e}")
            else:
                print(f"    {name:<18} unavailable: {v['why']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=512)
    parser.add_argument("--attn-lengths", default="2048,8000")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(f"no CUDA device here (torch {torch.__version__}, built with CUDA {torch.version.cuda}): "
              "nothing to check; run this on a machine with an NVIDIA GPU")
        return 0

    from playground.engine.kv import batch, measure

    started = time.perf_counter()
    lm = load(args.dtype)
    device = lm.device
    print(f"{lm.name} on {torch.cuda.get_device_name(device)} ({lm.dtype_name}), torch {torch.__version__}, "
          f"CUDA {torch.version.cuda}")
    print("\n1. ceilings (matmul and copy probes)")
    for dtype in sorted({lm.dtype, torch.float32}, key=str):
        c = measure.machine_ceilings(device, dtype)
        print(f"  {str(dtype).removeprefix('torch.'):<9} {c.peak_flops / 1e12:8.1f} TFLOP/s  "
              f"{c.peak_bytes_per_s / 1e9:8.1f} GB/s ({c.source})")

    print(f"\n2. memory over a decode ({args.prompt}-token prompt, {args.new_tokens} new tokens)")
    memory_over_decode(lm, args.prompt, args.new_tokens)

    print("\n3. attention implementations on long prefills")
    attention(lm, [int(n) for n in args.attn_lengths.split(",")])

    print("\n4. with vs without cache (200-token prompt, 64 new tokens)")
    prompt = torch.randint(3, lm.model.config.vocab_size, (200,)).tolist()
    batch.cached_decode(lm, prompt, 4)
    cached, cached_ms = batch.cached_decode(lm, prompt, 64)
    uncached, uncached_ms = batch.no_cache_decode(lm, prompt, 64)
    print(f"  same tokens: {cached == uncached}; median step after the first: cached "
          f"{statistics.median(cached_ms[1:]):.2f} ms, no cache {statistics.median(uncached_ms[1:]):.2f} ms; "
          f"all 64: {sum(uncached_ms) / sum(cached_ms):.2f}x")

    print("\n5. batch sweep (200-token prompt, 32 new tokens)")
    for point in batch.batch_sweep(lm, [prompt], [1, 4, 16, 64], 32):
        print(f"  N={point.size:>3} {point.ms_per_step:8.2f} ms/step {point.tokens_per_s:10.1f} tok/s  "
              f"KV {mib(point.kv_bytes)}")
    print(f"\ntotal {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
