"""Is our chain prompt lookup slower than transformers'? Paired, interleaved measurements on the grounded prompts of
``bench_speculative.py`` (issue #22: one run there gave ours 0.61x transformers', the speculative notes 0.96x).

Each round runs the four configurations (ours and transformers' plain greedy and prompt lookup) on one prompt in a
shuffled order, back to back, so a ratio of two runs of the same round shares the machine's load; the load average
is recorded per round. Reported: the median and the range of the per-round ratios, and of the tokens/s. Every output
must equal plain greedy (checked).

    .venv/bin/python benchmarks/bench_prompt_lookup_pairs.py [--rounds 5] [--new-tokens 64] [--k 10]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench_speculative import GROUNDED, ours, transformers_generate

from playground.config import ModelSettings
from playground.models.loading import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=10)
    args = parser.parse_args()
    lm = load_model(ModelSettings(device="cpu", dtype="float32"))
    n, k = args.new_tokens, args.k
    configs = {
        "ours greedy": lambda p: ours(lm, p, n),
        "ours prompt lookup": lambda p: ours(lm, p, n, strategy="speculative", draft="prompt-lookup", draft_k=k,
                                             prompt_lookup_ngram=2),
        "transformers greedy": lambda p: transformers_generate(lm, p, n),
        "transformers prompt lookup": lambda p: transformers_generate(lm, p, n, prompt_lookup_num_tokens=k),
    }
    for fn in configs.values():  # warm-up
        fn(GROUNDED[0])
    shuffle = random.Random(0)
    rates: dict[str, list[float]] = {c: [] for c in configs}
    ratios: dict[str, list[float]] = {"ours PL / transformers PL": [], "ours PL / ours greedy": [],
                                      "transformers PL / transformers greedy": [],
                                      "ours greedy / transformers greedy": []}
    loads = []
    for round_ in range(args.rounds):
        for prompt in GROUNDED:
            order = list(configs)
            shuffle.shuffle(order)
            loads.append(os.getloadavg()[0])
            got = {}
            for config in order:
                tokens, seconds, _ = configs[config](prompt)
                got[config] = (tokens, len(tokens) / seconds)
            outputs = {tuple(t) for t, _ in got.values()}
            assert len(outputs) == 1, f"round {round_}: an output differs from greedy on {prompt[:40]!r}"
            for config, (_, rate) in got.items():
                rates[config].append(rate)
            r = {c: rate for c, (_, rate) in got.items()}
            ratios["ours PL / transformers PL"].append(r["ours prompt lookup"] / r["transformers prompt lookup"])
            ratios["ours PL / ours greedy"].append(r["ours prompt lookup"] / r["ours greedy"])
            ratios["transformers PL / transformers greedy"].append(r["transformers prompt lookup"] /
                                                                   r["transformers greedy"])
            ratios["ours greedy / transformers greedy"].append(r["ours greedy"] / r["transformers greedy"])
    print(f"{lm.name} fp32 on {lm.device}, {len(GROUNDED)} grounded prompts x {args.rounds} rounds, {n} new tokens, "
          f"k={k}; load average per round: median {statistics.median(loads):.1f}, {min(loads):.1f}-{max(loads):.1f} "
          f"on {os.cpu_count()} CPUs; every output identical to greedy")
    for config, values in rates.items():
        print(f"  {config:<28} median {statistics.median(values):6.1f} tok/s  ({min(values):.1f}-{max(values):.1f})")
    for name, values in ratios.items():
        print(f"  {name:<40} median {statistics.median(values):5.2f}x  ({min(values):.2f}-{max(values):.2f})")


if __name__ == "__main__":
    main()
