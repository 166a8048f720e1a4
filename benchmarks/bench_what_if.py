"""The what-if re-derivation (``playground.state.what_if.re_derive``) of a 1,000-step run, for several settings,
against its goal: at most 50 ms on the GUI thread. The recorded candidates are unpacked once per run
(``RecordedRun.of``, timed apart); each settings change re-derives from them. The steps: random logits over the
default model's 49,152-token vocabulary (peaked like a model's: a few likely tokens, a long tail), packed as a run
records them (256 raw candidates a step), a 200-token prompt. Medians of repeated calls.

    .venv/bin/python benchmarks/bench_what_if.py [--steps 1000] [--record 256]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from playground.config import RunSettings
from playground.engine.step_analysis import pack_raw_candidates
from playground.events import Candidate, TokenStep
from playground.state.what_if import RecordedRun, re_derive

SETTINGS = {
    "the run's own (temperature 0.8, top-k 40, top-p 0.95)": dict(temperature=0.8, top_k=40, top_p=0.95),
    "top-p 0.9, min-p 0.05": dict(top_p=0.9, min_p=0.05),
    "penalties + typical + epsilon": dict(repetition_penalty=1.2, presence_penalty=0.3, frequency_penalty=0.2,
                                          top_k=100, typical_p=0.9, epsilon_cutoff=0.001),
    "every cheap sampler, custom order": dict(samplers="penalties;repetition_penalty;top_k;min_p;top_p;temperature",
                                              presence_penalty=0.4, repetition_penalty=1.1, top_k=60, min_p=0.02,
                                              top_p=0.9, temperature=1.3),
    "top-k 40 then mirostat (mu re-derived in passes)": dict(samplers="top_k;mirostat", top_k=40, mirostat=2,
                                                              mirostat_tau=3.0),
    "DRY and the n-gram ban (walk each step's context)": dict(dry_multiplier=0.8, dry_sequence_breakers=(),
                                                              no_repeat_ngram_size=3, top_k=40),
}


def fake_run(steps: int, record: int, vocab: int = 49152) -> tuple[list[int], list[TokenStep]]:
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (200,), generator=generator).tolist()
    out = []
    for i in range(steps):
        logits = torch.randn(vocab, generator=generator) * 2.5
        logits[torch.randint(0, vocab, (5,), generator=generator)] += 9.0  # a few likely tokens
        logprobs = logits.log_softmax(-1)
        top = torch.topk(logits, record).indices
        chosen = int(top[int(torch.randint(0, 3, (1,), generator=generator))])
        out.append(TokenStep(step=i, token_id=chosen, text="", prob=0.0, raw_prob=float(logprobs[chosen].exp()),
                             logprob=float(logprobs[chosen]), raw_rank=1, entropy=0.0, processed_entropy=0.0,
                             candidates=(Candidate(chosen, "", 0.0, 0.0, 1),), shown_raw_mass=0.0, effects=(),
                             forced=False, step_ms=0.0, kv_cache_bytes=0,
                             raw_top=pack_raw_candidates(top, logprobs, logits)))
    return prompt, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--record", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    prompt, steps = fake_run(args.steps, args.record)
    start = time.perf_counter()
    run = RecordedRun.of(steps, prompt)  # once per run (a saved run's load, a live run's end)
    unpack_ms = (time.perf_counter() - start) * 1000
    print(f"{args.steps} steps, {args.record} recorded candidates each, vocabulary 49152; goal <= 50 ms")
    print(f"{'unpacking the recorded candidates (once per run)':52s} {unpack_ms:7.1f} ms")
    for label, values in SETTINGS.items():
        settings = RunSettings(strategy="sample", **values).validate()
        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            what_if = re_derive(run, settings, breaker_ids=frozenset())
            times.append((time.perf_counter() - start) * 1000)
        ms = statistics.median(times)
        print(f"{label:52s} {ms:7.1f} ms  ({ms / 50:5.0%} of the goal)  exact on {what_if.exact.mean():4.0%}")


if __name__ == "__main__":
    main()
