"""The logit lens, early exit and layer skipping on the default model, side by side in one process.

1. Lens cost: plain greedy vs greedy with the lens (bfloat16 lens head, the default, and the model's own precision)
   on the same prompts: per-token step time (steps after the first: a plain run's first step reuses the prefill
   logits, a lens run's first step runs the model) and tokens/s. From the lens runs, per layer: lens entropy, top
   probability, agreement with the last layer, the cosine of the layer's output with its input (the saturation
   metric) and the relative residual update ||dh|| / ||h|| (the dynamic skip thresholds are chosen from it); and a
   preview of every exit rule on the full model's own tokens.
2. Early exit: entropy, max-prob and saturation thresholds (compare_full: every run is followed by the engine's
   full-model decode of the same prompt, so ``time_saved`` is a paired figure).
3. Layer skip: fixed skip sets, and dynamic thresholds picked from the measured residual updates.

Greedy is deterministic, so agreement figures do not vary across repeats; speeds are medians over prompts x
repeats, configurations alternating within every prompt.

    .venv/bin/python benchmarks/bench_layers.py [--new-tokens 48] [--sweep-tokens 48] [--repeats 2]
        [--sweep-repeats 1] [--min-exit-layer 20] [--late-exit-layer 26] [--skip-thresholds 0.1,0.15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time
from dataclasses import dataclass, field

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from playground.config import ModelSettings, RunSettings
from playground.engine.layers.lens import LayerOutputs, LayerStack
from playground.engine.strategies import run_strategy
from playground.events import RunFinished, RunStarted, TokenStep
from playground.events.layers import LayerStep
from playground.models.default_model import fetch_default_model
from playground.models.loading import load_model

PASSAGE = ("The lighthouse keeper climbed the spiral stairs every evening at dusk. He trimmed the wick, polished "
           "the great lens, and wrote the weather in a leather book.")
PROMPTS = [
    "Explain how a rainbow forms.",
    "Write a short story about a dragon who learns to bake bread.",
    f"Repeat the following text exactly, word for word:\n\n{PASSAGE}",
]
ENTROPY_BITS = (0.25, 0.5, 1.0, 2.0, 3.0)
MAX_PROBS = (0.9, 0.8, 0.6)
SATURATION = (0.99, 0.98, 0.95)
LATE_BITS, LATE_PROB = 0.25, 0.9  # the rows allowed to answer only from --late-exit-layer
FIXED_SKIPS = ("27", "26-27", "25-28", "20-28", "10-20")
GOAL_IDENTICAL = 0.95
GOAL_LENS = 1.5


@dataclass
class Run:
    prompt_ids: tuple[int, ...]
    finished: RunFinished
    layers: list[LayerStep]
    tokens: list[TokenStep]

    def later_steps_ms(self) -> float:
        """Mean step time of every step but the first (see the module docstring)."""
        return mean(t.step_ms for t in self.tokens[1:])


@dataclass
class Config:
    label: str
    flat: dict
    runs: list[Run] = field(default_factory=list)

    @property
    def figures(self) -> list[dict[str, float]]:
        return [r.finished.figures for r in self.runs]


def run(lm, prompt: str, new_tokens: int, **flat) -> Run:
    settings = RunSettings.from_flat(prompt=prompt, max_new_tokens=new_tokens, **flat)
    events = list(run_strategy(lm, settings))
    started, done = events[0], events[-1]
    assert isinstance(started, RunStarted) and isinstance(done, RunFinished), "a run ended without RunFinished"
    return Run(started.prompt_token_ids, done, [e for e in events if isinstance(e, LayerStep)],
               [e for e in events if isinstance(e, TokenStep)])


def sweep(lm, configs: list[Config], prompts: list[str], new_tokens: int, repeats: int) -> None:
    for _ in range(repeats):
        for prompt in prompts:
            for config in configs:
                config.runs.append(run(lm, prompt, new_tokens, **config.flat))


def median(values) -> float:
    values = list(values)
    return statistics.median(values) if values else float("nan")


def mean(values) -> float:
    values = list(values)
    return statistics.fmean(values) if values else float("nan")


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated percentile of an already sorted list (q in 0..1)."""
    pos = q * (len(sorted_values) - 1)
    low = int(pos)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (pos - low)


# 1. The lens ----------------------------------------------------------------------------------------------------

def lens_cost(lm, prompts: list[str], new_tokens: int, repeats: int) -> list[Run]:
    """Returns the default-precision lens runs of the first repeat (one per prompt)."""
    plain = Config("plain greedy", {})
    configs = [plain, Config("greedy + lens (bf16 head)", {"lens": True}),
               Config("greedy + lens (model prec.)", {"lens": True, "lens_precision": "model"})]
    sweep(lm, configs, prompts, new_tokens, repeats)
    for c in configs[1:]:
        for a, b in zip(plain.runs, c.runs, strict=True):
            assert a.finished.token_ids == b.finished.token_ids, f"{c.label} changed the greedy output"
    print(f"\n== 1. Lens cost: {len(prompts)} prompts x {repeats} repeats, {new_tokens} new tokens; outputs identical "
          f"with and without the lens")
    print(f"  {'configuration':<28} {'tok/s':>6} {'step ms':>8} {'x plain':>8} {'lens ms':>8} {'fwd ms':>7}   "
          f"paired step ratios")
    for c in configs:
        ratios = [b.later_steps_ms() / a.later_steps_ms() for a, b in zip(plain.runs, c.runs, strict=True)]
        steps = [s for r in c.runs for s in r.layers]
        lens = f"{mean(s.lens_ms for s in steps):8.1f} {mean(s.forward_ms for s in steps):7.1f}" if steps else " " * 16
        print(f"  {c.label:<28} {median(r.finished.tokens_per_s for r in c.runs):6.1f} "
              f"{median(r.later_steps_ms() for r in c.runs):8.1f} {median(ratios):7.2f}x {lens}   "
              + ("" if c is plain else ", ".join(f"{x:.2f}" for x in ratios)))
    print(f"  step ms: median over runs of the mean step time of steps 2..; x plain: median of the paired per-run "
          f"ratios (goal for the default lens <= {GOAL_LENS:.2f}x); lens ms, fwd ms: LayerStep.lens_ms / forward_ms "
          f"means; tok/s: RunFinished.tokens_per_s (a plain run's first step has no forward pass)")
    return configs[1].runs[: len(prompts)]


def cosines(lm, r: Run) -> list[list[float]]:
    """Per step, per layer: cosine of the layer's output with its input at the position that step fed (one
    batched forward over the prompt and the generated tokens, the layers' inputs and outputs captured by hooks).
    Checked against the run's own residual updates, so the positions line up."""
    generated = list(r.finished.token_ids)
    ids = torch.tensor([[*r.prompt_ids, *generated[:-1]]], device=lm.device)
    stack = LayerStack.of(lm.model)
    with torch.inference_mode(), LayerOutputs(stack, rows=len(generated)) as cap:
        lm.model(input_ids=ids, use_cache=False)
        cos = [torch.cosine_similarity(i.float(), o.float(), dim=-1).tolist()
               for i, o in zip(cap.inputs, cap.outputs, strict=True)]  # [layer][step]
        upd = [((o.float() - i.float()).norm(dim=-1) / i.float().norm(dim=-1)).tolist()
               for i, o in zip(cap.inputs, cap.outputs, strict=True)]
    for s, step in enumerate(r.layers):
        for layer, recorded in enumerate(step.residual_update):
            assert abs(upd[layer][s] - recorded) <= 0.02 * recorded + 1e-3, "captured positions do not line up"
    return [[cos[layer][s] for layer in range(stack.count)] for s in range(len(generated))]


def per_layer_table(steps: list[LayerStep], cos: list[list[float]]) -> list[float]:
    """Per-layer lens, saturation and residual-update figures from full-model lens steps; returns the pooled
    updates of the layers whose update can trigger a dynamic skip (the first n - 2)."""
    n = steps[0].layers_total
    print(f"\n== Per-layer figures from the lens runs ({len(steps)} tokens, every layer ran): lens entropy (bits), top "
          f"probability, share of tokens whose lens top-1 equals the last layer's, cosine of the layer's output with "
          f"its input (saturation), and the relative residual update dh = ||h_out - h_in|| / ||h_in||")
    print(f"  {'layer':>5} {'H p50':>6} {'top p50':>7} {'agree':>6} | {'cos p50':>7} {'p95':>6} {'max':>6} | "
          f"{'dh min':>7} {'p5':>6} {'p25':>6} {'p50':>6} {'p75':>6} {'p95':>6}")
    triggers: list[float] = []
    for i in range(n):
        updates = sorted(s.residual_update[i] for s in steps)
        cs = sorted(c[i] for c in cos)
        if i < n - 2:  # layer i + 1's update decides whether layer i + 2 (never the first or last) is skipped
            triggers.extend(updates)
        print(f"  {i + 1:>5} {median(s.layer_entropy[i] for s in steps):6.2f} "
              f"{median(s.layer_top_prob[i] for s in steps):7.2f} "
              f"{mean(bool(s.agrees_with_final[i]) for s in steps):6.2f} | {percentile(cs, 0.5):7.4f} "
              f"{percentile(cs, 0.95):6.4f} {cs[-1]:6.4f} | {updates[0]:7.3f} "
              + " ".join(f"{percentile(updates, q):6.3f}" for q in (0.05, 0.25, 0.5, 0.75, 0.95)))
    triggers.sort()
    print(f"  dh pooled over layers 1-{n - 2} (the updates the dynamic skip rule reads): "
          + ", ".join(f"p{round(q * 100)} {percentile(triggers, q):.3f}" for q in (0.01, 0.05, 0.1, 0.25, 0.5))
          + f"; share below the default 0.1: {sum(u < 0.1 for u in triggers) / len(triggers):.3f}")
    return triggers


def rule_preview(steps: list[LayerStep], cos: list[list[float]], metric: str, threshold: float,
                 min_layer: int) -> tuple[float, float]:
    """On the full model's own trajectory: the share of tokens where the exit rule would fire before the last
    layer, and the share of those exits whose lens top-1 equals the last layer's."""
    n = steps[0].layers_total
    fired = right = 0
    for s, c in zip(steps, cos, strict=True):
        for i in range(min_layer - 1, n - 1):
            if metric == "entropy":
                confident = s.layer_entropy[i] <= threshold
            elif metric == "max-prob":
                confident = s.layer_top_prob[i] >= threshold
            else:
                confident = c[i] >= threshold
            if confident:
                fired += 1
                right += bool(s.agrees_with_final[i])
                break
    return fired / len(steps), right / fired if fired else float("nan")


def preview_grid(steps: list[LayerStep], cos: list[list[float]]) -> None:
    n = steps[0].layers_total
    layers = sorted({1, n // 3, n // 2, 2 * n // 3, n - 6, n - 4, n - 2, n - 1})
    print(f"\n== Exit-rule preview on the lens runs (no early-exit run: the full model's own {len(steps)} tokens): "
          f"share of tokens where the rule would exit before the last layer / share of those exits whose top-1 "
          f"equals the last layer's; columns: first layer allowed to answer")
    print(f"  {'rule':<16}" + "".join(f"{'L' + str(m) + '+':>12}" for m in layers))
    rules = [("entropy", t) for t in (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0)]
    rules += [("max-prob", p) for p in (0.999, 0.99, 0.95, 0.9, 0.8)]
    rules += [("saturation", c) for c in (0.999, 0.995, 0.99, 0.98, 0.95, 0.9)]
    for metric, threshold in rules:
        name = {"entropy": "H<=", "max-prob": "max-prob>=", "saturation": "cos>="}[metric] + f"{threshold:g}"
        cells = []
        for m in layers:
            fired, right = rule_preview(steps, cos, metric, threshold, m)
            cells.append(f"{fired:.2f}/{right:.2f}" if fired else "0.00/-")
        print(f"  {name:<16}" + "".join(f"{c:>12}" for c in cells))


# 2 and 3. Early exit and layer skip ----------------------------------------------------------------------------

def pooled_identical(c: Config, prompts: int) -> float:
    first = c.runs[:prompts]  # greedy: every repeat gives the same tokens
    return (sum(r.finished.figures["identical_fraction"] * len(r.finished.token_ids) for r in first)
            / sum(len(r.finished.token_ids) for r in first))


def table(title: str, configs: list[Config], prompts: int, extra: dict[str, str]) -> None:
    print(title)
    print(f"  {'configuration':<30} {'ident':>6} {'1st div':>9} {'exits':>6} {'layers':>6} {'comp sv':>7} "
          f"{'time sv':>7} {'tok/s':>6} {'full':>6} {'fwd sv':>7} {'lens ms':>7}  {'':<14}")
    for c in configs:
        figs = c.figures
        steps = [s for r in c.runs for s in r.layers]
        first_div = ",".join(f"{int(f['first_divergence'])}" for f in figs[:prompts])
        # the loop's own time (the recorded lens statistics left out) against the full model's step time
        fwd_saved = median(1 - mean(s.forward_ms for s in r.layers[1:]) * r.finished.figures["full_tokens_per_s"]
                           / 1000 for r in c.runs)
        print(f"  {c.label:<30} {pooled_identical(c, prompts):6.3f} {first_div:>9} "
              f"{mean(s.exit_layer is not None for s in steps):6.2f} {mean(s.layers_computed for s in steps):6.1f} "
              f"{mean(f['compute_saved'] for f in figs):7.3f} {median(f['time_saved'] for f in figs):7.3f} "
              f"{median(r.finished.tokens_per_s for r in c.runs):6.1f} "
              f"{median(f['full_tokens_per_s'] for f in figs):6.1f} "
              f"{fwd_saved:7.3f} {mean(s.lens_ms for s in steps):7.1f}  {extra.get(c.label, '')}")
    print("  ident: share of greedy tokens identical position by position (pooled over prompts); 1st div: first "
          "differing position per prompt (-1: none); exits: share of tokens that left early; layers: mean layers run "
          "per token; comp sv: compute_saved (share of layers not run); time sv: the engine's time_saved, median "
          "(its full-model speed counts one forward pass fewer than steps: it understates savings by ~1/tokens); "
          "tok/s, full: medians; fwd sv: 1 - LayerStep.forward_ms / full step (the loop alone, checks included, "
          "recorded-lens statistics left out); lens ms: LayerStep.lens_ms mean")


def describe(c: Config, prompts: int) -> str:
    figs = c.figures
    return (f"{c.label}: identical {pooled_identical(c, prompts):.3f}, layer compute saved "
            f"{mean(f['compute_saved'] for f in figs):.3f}, "
            f"wall time saved {median(f['time_saved'] for f in figs):.3f}")


def early_exit(lm, prompts: list[str], new_tokens: int, repeats: int, min_layer: int, late_layer: int,
               steps: list[LayerStep], cos: list[list[float]]) -> None:
    def config(label: str, metric: str, threshold: float, first: int, **more) -> Config:
        return Config(label, {"strategy": "early-exit", "compare_full": True, "exit_metric": metric,
                              "exit_threshold": threshold, "min_exit_layer": first, **more})

    configs = [config("H<=1 bit, L1+ (engine default)", "entropy", 1.0, 1)]
    configs += [config(f"H<={t:g} bits, L{min_layer}+", "entropy", t, min_layer) for t in ENTROPY_BITS]
    configs += [config(f"max-prob>={p:g}, L{min_layer}+", "max-prob", p, min_layer) for p in MAX_PROBS]
    configs += [config(f"cos>={c:g}, L{min_layer}+", "saturation", c, min_layer) for c in SATURATION]
    if late_layer:  # the preview's most promising cells: the strictest rules, answering only near the top
        configs += [config(f"H<={LATE_BITS:g} bits, L{late_layer}+", "entropy", LATE_BITS, late_layer),
                    config(f"H<={LATE_BITS:g} bits, L{late_layer}+, fp32 lens", "entropy", LATE_BITS, late_layer,
                           lens_precision="model"),
                    config(f"max-prob>={LATE_PROB:g}, L{late_layer}+", "max-prob", LATE_PROB, late_layer)]
    sweep(lm, configs, prompts, new_tokens, repeats)
    preview = {}
    for c in configs:
        fired, right = rule_preview(steps, cos, c.flat["exit_metric"], c.flat["exit_threshold"],
                                    c.flat["min_exit_layer"])
        preview[c.label] = f"{fired:.2f}/{right:.2f}"
    table(f"\n== 2. Early exit: {len(prompts)} prompts x {repeats} repeats, {new_tokens} new tokens, compare_full "
          f"(last column: the section-1 preview of the same rule, exit share / exits agreeing)", configs,
          len(prompts), preview)
    for metric in ("entropy", "max-prob", "saturation"):
        rows = [c for c in configs[1:] if c.flat["exit_metric"] == metric]
        ok = [c for c in rows if pooled_identical(c, len(prompts)) >= GOAL_IDENTICAL]
        if ok:  # the loosest passing rule: the one that leaves the most layers out
            best = max(ok, key=lambda c: mean(f["compute_saved"] for f in c.figures))
            print(f"  {metric}: loosest rule keeping >= {GOAL_IDENTICAL:.0%} identical: {describe(best, len(prompts))}")
        else:
            best = max(rows, key=lambda c: pooled_identical(c, len(prompts)))
            print(f"  {metric}: no rule keeps >= {GOAL_IDENTICAL:.0%} identical; the most faithful was "
                  f"{describe(best, len(prompts))}")


def layer_skip(lm, prompts: list[str], new_tokens: int, repeats: int, thresholds: list[float]) -> None:
    base = {"strategy": "layer-skip", "compare_full": True}
    configs = [Config(f"skip {s} (threshold off)", {**base, "skip_layers": s, "skip_threshold": 0.0})
               for s in FIXED_SKIPS]
    configs += [Config(f"dynamic dh<{t:g}", {**base, "skip_layers": "", "skip_threshold": t}) for t in thresholds]
    sweep(lm, configs, prompts, new_tokens, repeats)
    skipped = {c.label: f"skips {mean(len(s.skipped) for r in c.runs for s in r.layers):.2f}/tok" for c in configs}
    table(f"\n== 3. Layer skip: {len(prompts)} prompts x {repeats} repeats, {new_tokens} new tokens, compare_full",
          configs, len(prompts), skipped)
    ok = [c for c in configs if not c.flat["skip_layers"] and pooled_identical(c, len(prompts)) >= GOAL_IDENTICAL]
    if ok:
        best = max(ok, key=lambda c: c.flat["skip_threshold"])
        print(f"  largest dynamic threshold keeping >= {GOAL_IDENTICAL:.0%} identical: {describe(best, len(prompts))}")
    else:
        print(f"  no dynamic threshold keeps >= {GOAL_IDENTICAL:.0%} identical")


def engine_version() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "playground"], capture_output=True, text=True)
        return head.stdout.strip() + (" (playground/ modified)" if dirty.stdout.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=48, help="new tokens per lens-cost run")
    parser.add_argument("--sweep-tokens", type=int, default=48, help="new tokens per early-exit / layer-skip run")
    parser.add_argument("--repeats", type=int, default=2, help="repeats of the lens-cost comparison")
    parser.add_argument("--sweep-repeats", type=int, default=1,
                        help="repeats of the sweeps (agreement is deterministic; each run is paired with a "
                             "full decode)")
    parser.add_argument("--min-exit-layer", type=int, default=20,
                        help="first layer allowed to answer in the threshold sweep (one extra row uses 1, the default)")
    parser.add_argument("--late-exit-layer", type=int, default=26,
                        help=f"three extra early-exit rows (entropy <= {LATE_BITS:g} bits in bf16 and fp32, "
                             f"max-prob >= {LATE_PROB:g}) allowed to answer only from this layer (0: none)")
    parser.add_argument("--skip-thresholds", default="",
                        help="comma-separated dynamic skip thresholds (default: pooled p1/p5/p10/p25 of the "
                             "measured updates, and the engine default 0.1)")
    args = parser.parse_args()
    start = time.perf_counter()
    fetch_default_model()
    lm = load_model(ModelSettings(device="cpu", dtype="float32"))
    print(f"{lm.name} fp32 on {lm.device}, {torch.get_num_threads()} threads, "
          f"OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}, engine at {engine_version()}")
    for flat in ({}, {"lens": True}, {"lens": True, "lens_precision": "model"},  # warm-up every path
                 {"strategy": "early-exit", "compare_full": False},
                 {"strategy": "layer-skip", "skip_layers": "27", "compare_full": False}):
        run(lm, PROMPTS[0], 4, **flat)

    lens_runs = lens_cost(lm, PROMPTS, args.new_tokens, args.repeats)
    steps = [s for r in lens_runs for s in r.layers]
    cos = [c for r in lens_runs for c in cosines(lm, r)]
    triggers = per_layer_table(steps, cos)
    preview_grid(steps, cos)
    if args.skip_thresholds:
        thresholds = [float(t) for t in args.skip_thresholds.split(",")]
    else:
        thresholds = sorted({round(percentile(triggers, q), 3) for q in (0.01, 0.05, 0.1, 0.25)} | {0.1})
    print(f"  dynamic skip thresholds for section 3: {', '.join(f'{t:g}' for t in thresholds)}")
    early_exit(lm, PROMPTS, args.sweep_tokens, args.sweep_repeats, args.min_exit_layer, args.late_exit_layer,
               steps, cos)
    layer_skip(lm, PROMPTS, args.sweep_tokens, args.sweep_repeats, thresholds)
    print(f"\ntotal {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
