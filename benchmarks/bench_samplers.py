"""The whole sampler chain with every sampler on against a plain decode step, side by side in one process.

A decode step: one token through the default model with its KV cache (a ~200-token context). The chain: every
sampler of ``--samplers`` on (penalties, DRY, logit bias, temperature with its dynamic range, top-k/p, min-p,
typical, epsilon, eta, top-nσ, XTC, mirostat; guidance's combination, fed precomputed negative logits: its second
forward pass is a model step of its own, reported apart) run by ``analyse_step`` as a sampling run runs it, with
each stage kept for the chart, and the token drawn. Two ways side by side: every stage on the whole vocabulary with
the draw over it (before), and the stages after the first cut on the compact set with the draw among its tokens
(now, ``engine/samplers/chain.py``). They alternate with the decode step, so machine noise hits all three; medians
are reported with the share. Goal: the chain costs at most 5 % of a decode step.

    .venv/bin/python benchmarks/bench_samplers.py [--model PATH] [--steps 60]
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
from playground.engine.forward import prefill
from playground.engine.processors import SamplerRun, build_pipeline
from playground.engine.prompt import encode_prompt
from playground.engine.step_analysis import analyse_step
from playground.models.default_model import fetch_default_model
from playground.models.loading import load_model

PROMPT = ("Write a long story about a dragon who learns to bake bread. The dragon lives in a cave above a village, "
          "and every morning the smell of bread drifts up from the baker's shop. ") * 4
EVERY_SAMPLER = dict(
    strategy="sample", temperature=0.8, dynatemp_range=0.3, top_k=200, top_p=0.95, min_p=0.01, typical_p=0.95,
    epsilon_cutoff=0.0001, eta_cutoff=0.0001, top_n_sigma=3.0, xtc_probability=0.5, xtc_threshold=0.1, mirostat=2,
    repetition_penalty=1.1, no_repeat_ngram_size=4, presence_penalty=0.3, frequency_penalty=0.2, dry_multiplier=0.8,
    logit_bias=(" the=-1", "42=-inf"), guidance_scale=1.5,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    if args.model is None:
        fetch_default_model()
    lm = load_model(ModelSettings(path=args.model, device=args.device))
    settings = RunSettings(prompt=PROMPT, **EVERY_SAMPLER).validate()
    prompt_ids, _ = encode_prompt(lm, settings)
    run = SamplerRun.of(settings, torch.Generator(device=lm.device).manual_seed(0), sampling=True)
    pipeline = build_pipeline(settings, sampling=True, tokenizer=lm.tokenizer, vocab_size=lm.model.config.vocab_size,
                              run=run)
    step_ms, chain_ms, full_ms, bare_ms, record_ms = [], [], [], [], []
    full_generator = torch.Generator(device=lm.device).manual_seed(0)
    with torch.inference_mode():
        ids = torch.tensor([prompt_ids], device=lm.device)
        logits, cache = prefill(lm.model, ids)
        run.negative_logits = logits.float().roll(1, dims=-1)  # any other distribution: the combination's cost
        for _ in range(args.steps):
            mu = run.mirostat.mu if run.mirostat is not None else 0.0
            start = time.perf_counter()  # before: the whole vocabulary throughout
            analysis = analyse_step(pipeline, ids, logits.float(), settings.num_candidates, compact=False)
            int(torch.multinomial(analysis.processed_probs, 1, generator=full_generator).item())
            full_ms.append((time.perf_counter() - start) * 1000)
            if run.mirostat is not None:
                run.mirostat.mu = mu  # the same step again, now on the compact set
            start = time.perf_counter()
            analysis = analyse_step(pipeline, ids, logits.float(), settings.num_candidates)
            token = analysis.draw(run.generator)
            run.accept(token, float(analysis.processed_probs[0, token]))
            chain_ms.append((time.perf_counter() - start) * 1000)
            start = time.perf_counter()
            analyse_step((), ids, logits.float(), settings.num_candidates)  # what every step records anyway
            bare_ms.append((time.perf_counter() - start) * 1000)
            start = time.perf_counter()  # ... and with the raw candidates a greedy or sample run keeps (what-if)
            analyse_step((), ids, logits.float(), settings.num_candidates, record=settings.record_candidates)
            record_ms.append((time.perf_counter() - start) * 1000)
            ids = torch.cat([ids, ids.new_tensor([[token]])], dim=1)
            start = time.perf_counter()
            logits = lm.model(input_ids=ids[:, -1:], cache=cache, use_cache=True).logits[:, -1, :]
            step_ms.append((time.perf_counter() - start) * 1000)
    step, bare = statistics.median(step_ms), statistics.median(bare_ms)
    chain, full = statistics.median(chain_ms), statistics.median(full_ms)
    print(f"model {lm.name} on {lm.device} ({lm.dtype_name}), context {len(prompt_ids)}-{ids.shape[1]} tokens, "
          f"{len(pipeline)} samplers on ({', '.join(t.name for t in pipeline)}), median of {args.steps} steps")
    print(f"plain decode step (model forward)          {step:7.2f} ms")
    print(f"step analysis with no sampler              {bare:7.2f} ms")
    print(f"... recording {settings.record_candidates} raw candidates (what-if)    "
          f"{statistics.median(record_ms):7.2f} ms   ({(statistics.median(record_ms) - bare) / step:.1%} of a step)")
    print("                                          whole vocabulary   compact after the first cut")
    print(f"whole sampler chain (every stage + draw)   {full:7.2f} ms         {chain:7.2f} ms")
    print(f"chain / decode step                        {full / step:7.1%}            {chain / step:7.1%}"
          "   (goal <= 5 %; guidance adds one more forward)")
    print(f"(chain - no sampler) / decode step         {(full - bare) / step:7.1%}            "
          f"{(chain - bare) / step:7.1%}")


if __name__ == "__main__":
    main()
