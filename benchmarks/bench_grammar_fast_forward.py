"""Fast-forward tokens from one batched pass against step by step, side by side in one process on the default model.

An extraction schema with long fixed keys (the tokens the grammar fixes, each the only one allowed, go through the
model together: ``playground.engine.fast_forward``), constrained greedy with and without the batching (``MAX_RUN``
0: one pass per token). Runs alternate (A, B, A, B, ...) after one warm-up each. The rate is the decode's (the runs'
``tokens_per_s``: prefill left out); the forward calls are counted with a hook; the two runs' tokens must be equal.

    .venv/bin/python benchmarks/bench_grammar_fast_forward.py [--model PATH] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os

from side_by_side import report

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import playground.engine.fast_forward as fast_forward
from playground.config import ModelSettings, RunSettings
from playground.config.samplers.grammar import GrammarSettings
from playground.engine.sampling import run_sampling
from playground.events import RunFinished, TokenStep

PROMPT = ("Extract the order as JSON: \"Maria Lopez ordered two blue ceramic teapots on 3 May, to be delivered "
          "to 14 Harbour Street, Lisbon, paid by card.\"")
KEYS = ("customer_full_name", "number_of_items_ordered", "item_description_text", "delivery_street_address",
        "delivery_city_name", "payment_method_used")
SCHEMA = {"type": "object", "properties": {k: {"type": "integer"} if k.startswith("number") else
                                           {"type": "string", "maxLength": 40} for k in KEYS},
          "required": list(KEYS), "additionalProperties": False}


def decode(lm, settings: RunSettings, batched: bool) -> tuple[RunFinished, list[TokenStep], int]:
    calls = [0]
    hook = lm.model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    saved = fast_forward.MAX_RUN
    fast_forward.MAX_RUN = saved if batched else 0
    try:
        events = list(run_sampling(lm, settings))
    finally:
        hook.remove()
        fast_forward.MAX_RUN = saved
    done = events[-1]
    assert isinstance(done, RunFinished)
    return done, [e for e in events if isinstance(e, TokenStep)], calls[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from playground.models.default_model import fetch_default_model, is_default_model_ready
    from playground.models.loading import load_model

    if args.model is None and not is_default_model_ready():
        fetch_default_model()
    lm = load_model(ModelSettings(path=args.model))
    settings = RunSettings(prompt=PROMPT, strategy="greedy", max_new_tokens=160).with_group(
        GrammarSettings(json_schema=json.dumps(SCHEMA))).validate()
    decode(lm, settings, True)
    decode(lm, settings, False)  # warm-up: llguidance's tokenizer for this model is built once
    rates: dict[bool, list[float]] = {True: [], False: []}
    runs = {}
    for _ in range(args.repeats):
        for batched in (False, True):
            done, steps, calls = decode(lm, settings, batched)
            rates[batched].append(done.tokens_per_s)
            runs[batched] = (done, steps, calls)
    (done, steps, calls), (_, plain_steps, plain_calls) = runs[True], runs[False]
    assert [s.token_id for s in steps] == [s.token_id for s in plain_steps], "the batching changed the tokens"
    fed = sum(s.grammar is not None and s.grammar.fast_forward for s in steps)
    print(f"{len(steps)} tokens, stop {done.stop_reason}; {fed} fast-forward; text {done.text[:70]!r}...")
    print(f"forward calls (prefill included): step by step {plain_calls}, batched {calls}")
    report(f"constrained greedy, {lm.name} on {lm.device}", "tok/s", ("step by step", rates[False]),
           ("fast-forward batched", rates[True]), 1.0)


if __name__ == "__main__":
    main()
