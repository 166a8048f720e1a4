"""Chain against tree speculation on the default model, each drafter, on the grounded and open-ended prompts of
``bench_speculative.py``: mean accepted tokens per target pass and tokens/s, side by side in one process.

Every configuration decodes greedily, so every output must equal plain greedy (checked). The configurations of a
prompt run back to back in a shuffled order each repeat (a ratio shares the machine's load; the load average is
printed). The suffix drafter learns from this session's earlier runs: "cold" forgets them before each run (only
the prompt and the output so far), "warm" runs after a plain run of the same prompt (SuffixDecoding's repeated
workload).

    .venv/bin/python benchmarks/bench_tree_speculative.py [--new-tokens 64] [--repeats 3] [--width 2] [--nodes 14]
        [--model-nodes 8] [--only prompt-lookup,suffix]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench_speculative import GROUNDED, OPEN_ENDED
from bench_speculative import ours as run

from playground.config import ModelSettings
from playground.models.default_model import fetch_default_model
from playground.models.loading import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--k", type=int, default=10, help="prompt lookup's and the suffix drafter's depth")
    parser.add_argument("--width", type=int, default=2, help="the trees' width")
    parser.add_argument("--nodes", type=int, default=14, help="the model-free trees' node budget")
    parser.add_argument("--model-nodes", type=int, default=8, help="the model drafters' trees' node budget")
    parser.add_argument("--layers", type=int, default=10, help="the layers drafter's layers (depth 4)")
    parser.add_argument("--model-k", type=int, default=4, help="the model drafters' depth")
    parser.add_argument("--quant", default="rtn-int4", help="the quantized drafter's copy")
    parser.add_argument("--only", default="", help="drafters, e.g. prompt-lookup,suffix")
    args = parser.parse_args()
    fetch_default_model()
    lm = load_model(ModelSettings(device="cpu", dtype="float32"))
    n, k, width, nodes = args.new_tokens, args.k, args.width, args.nodes
    tree = {"tree_width": width, "tree_nodes": nodes}
    drafters = {
        "prompt-lookup": {"draft": "prompt-lookup", "draft_k": k, "prompt_lookup_ngram": 2},
        "layers": {"draft": "layers", "draft_k": args.model_k, "draft_layers": args.layers},
        "quantized": {"draft": "quantized", "draft_quant": args.quant, "draft_k": args.model_k},
        "suffix cold": {"draft": "suffix", "draft_k": k},
        "suffix warm": {"draft": "suffix", "draft_k": k},
    }
    only = {name.strip() for name in args.only.split(",") if name.strip()}
    configs: dict[str, dict] = {"plain greedy": {}}
    for name, options in drafters.items():
        if only and name.split()[0] not in only:
            continue
        configs[f"{name} chain"] = {"strategy": "speculative", **options}
        budget = args.model_nodes if name in ("layers", "quantized") else nodes
        configs[f"{name} tree"] = {"strategy": "speculative", **options, **tree, "tree_nodes": budget}
    rng = random.Random(0)
    print(f"{lm.name} fp32 on {lm.device}, {n} new tokens, trees {width} wide <= {nodes} nodes (model drafters "
          f"<= {args.model_nodes}), "
          f"{torch_threads()} threads")
    for label, prompts in (("grounded", GROUNDED), ("open-ended", OPEN_ENDED)):
        rates: dict[str, list[float]] = {c: [] for c in configs}
        per_pass: dict[str, list[float]] = {c: [] for c in configs}
        accepted: dict[str, list[float]] = {c: [] for c in configs}
        loads = []
        run(lm, prompts[0][:200], 8)  # warm-up
        for _ in range(args.repeats):
            for prompt in prompts:
                order = list(configs)
                rng.shuffle(order)
                loads.append(os.getloadavg()[0])
                reference = None
                outputs = {}
                for config in order:
                    options = configs[config]
                    if config.startswith("suffix"):
                        lm.history.forget()
                        if "warm" in config:
                            run(lm, prompt, n)  # the same prompt ran before
                    tokens, seconds, figures = run(lm, prompt, n, **options)
                    outputs[config] = tokens
                    rates[config].append(len(tokens) / seconds)
                    if figures:
                        calls = figures["rounds"]
                        accepted[config].append(figures["accepted"] / calls if calls else 0.0)
                        per_pass[config].append(len(tokens) / figures["target_calls"])
                reference = outputs["plain greedy"]
                for config, tokens in outputs.items():
                    assert tokens == reference, f"{config} changed the greedy output on {prompt[:40]!r}"
        base = statistics.median(rates["plain greedy"])
        print(f"\n{label} prompts ({len(prompts)}), median of {args.repeats} x {len(prompts)} runs; load average "
              f"{min(loads):.2f}-{max(loads):.2f}; every output identical to plain greedy")
        print(f"  {'configuration':<22} {'tok/s':>7} {'x greedy':>9} {'accepted/pass':>14} {'tokens/pass':>12}"
              f" {'tree vs chain':>14}")
        for config in configs:
            median = statistics.median(rates[config])
            row = f"  {config:<22} {median:7.1f} {median / base:9.2f}"
            if accepted[config]:
                mean_accepted = statistics.mean(accepted[config])
                row += f" {mean_accepted:14.2f} {statistics.mean(per_pass[config]):12.2f}"
                if config.endswith("tree"):
                    chain = config[: -len("tree")] + "chain"
                    gain = mean_accepted / statistics.mean(accepted[chain]) - 1 if statistics.mean(
                        accepted[chain]) else float("nan")
                    speed = median / statistics.median(rates[chain])
                    row += f"   {gain:+.0%} acc, {speed:.2f}x speed"
            print(row)


def torch_threads() -> int:
    import torch

    return torch.get_num_threads()


if __name__ == "__main__":
    main()
