"""Constrained greedy (a JSON schema, llguidance's mask on every step) against plain greedy, side by side in one
process on the default model.

The schema asks for an object with a long string (``minLength``), so both runs take the whole budget (the
constrained one ends "grammar_incomplete"); runs alternate (A, B, A, B, ...) so machine noise hits both, after one
warm-up each (the first builds llguidance's tokenizer, ~2 s, once per model). The rate is the decode's (the runs'
``tokens_per_s``: prefill left out). Then the mask's own cost: the recorded tokens replayed through a fresh
constraint, timing what a step adds (the mask, its record against the raw distribution, the matcher's advance)
against the plain run's median step. Goal: >= 0.9x the plain rate (the mask <= 10 % of a step).

    .venv/bin/python benchmarks/bench_grammar.py [--model PATH] [--new-tokens 64] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from side_by_side import report

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from playground.config import ModelSettings, RunSettings
from playground.config.samplers.grammar import GrammarSettings
from playground.engine.processors import SamplerRun, build_pipeline
from playground.engine.sampling import run_sampling
from playground.events import RunFinished, TokenStep

PROMPT = "Describe a dragon who learns to bake bread, as a JSON object with one field, story."
SCHEMA = {"type": "object", "properties": {"story": {"type": "string", "minLength": 2000}}, "required": ["story"]}


def decode(lm, settings: RunSettings) -> tuple[RunFinished, list[TokenStep]]:
    events = list(run_sampling(lm, settings))
    done = events[-1]
    assert isinstance(done, RunFinished)
    return done, [e for e in events if isinstance(e, TokenStep)]


def mask_cost_ms(lm, settings: RunSettings, tokens: list[int]) -> float:
    """Median milliseconds a step spends in the constraint: apply on the logits, the record, accept."""
    run = SamplerRun.of(settings, torch.Generator().manual_seed(0), sampling=False)
    (grammar,) = [s for s in build_pipeline(settings, sampling=False, tokenizer=lm.tokenizer,
                                            vocab_size=lm.model.config.vocab_size, run=run,
                                            eos_ids=lm.eos_token_ids) if s.name == "grammar"]
    logits = torch.randn(1, lm.model.config.vocab_size)
    probs = logits.softmax(dim=-1)
    ids = torch.zeros(1, 1, dtype=torch.long)
    times = []
    for token in tokens:
        start = time.perf_counter()
        grammar.apply(ids, logits)
        grammar.step_record(probs, 0)
        grammar.accept(token, 1.0)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    from playground.models.default_model import fetch_default_model, is_default_model_ready
    from playground.models.loading import load_model

    if args.model is None and not is_default_model_ready():
        fetch_default_model()
    lm = load_model(ModelSettings(path=args.model))
    plain = RunSettings(prompt=PROMPT, strategy="greedy", max_new_tokens=args.new_tokens).validate()
    constrained = plain.with_group(GrammarSettings(json_schema=json.dumps(SCHEMA))).validate()
    decode(lm, plain)
    decode(lm, constrained)  # warm-up: llguidance's tokenizer for this model is built once
    rates: dict[str, list[float]] = {"plain": [], "constrained": []}
    step_ms: list[float] = []
    last: tuple[RunFinished, list[TokenStep]] | None = None
    for _ in range(args.repeats):
        done, steps = decode(lm, plain)
        rates["plain"].append(done.tokens_per_s)
        step_ms.append(statistics.median(s.step_ms for s in steps))
        last = decode(lm, constrained)
        rates["constrained"].append(last[0].tokens_per_s)
    assert last is not None
    done, steps = last
    print(f"constrained run: {len(steps)} tokens, stop {done.stop_reason}; text {done.text[:60]!r}...")
    forced = sum(s.grammar is not None and s.grammar.top_forbidden for s in steps)
    print(f"steps where the schema overrode the model's top token: {forced} of {len(steps)}")
    report(f"greedy, {args.new_tokens} new tokens, {lm.name} on {lm.device}", "tok/s",
           ("plain greedy", rates["plain"]), ("constrained greedy (JSON schema)", rates["constrained"]), 0.9)
    cost = mask_cost_ms(lm, constrained, [s.token_id for s in steps])
    step = statistics.median(step_ms)
    print(f"the constraint's own work: {cost:.3f} ms a step (median) against a plain step of {step:.1f} ms: "
          f"{100 * cost / step:.1f} % (goal <= 10 %)")


if __name__ == "__main__":
    main()
