"""Activation patching and prompt salience on the default model: each map's time.

Patching a 20-token prompt pair (a clean fact and its corrupted copy, one city changed) over every block: the
residual, attention and MLP maps as the ``patching`` strategy computes them (a batched pass per block, a row per
position, starting at that block from the corrupted run's cached state), and the naive way for comparison (one
full forward per block and position with a hook), measured on ``--naive-blocks`` blocks and scaled to all of them
(an estimate, labelled so). Goal: the residual map under 60 s. Then the salience of the clean prompt's next token
by each method, and the methods' rank correlations.

    .venv/bin/python benchmarks/bench_patching.py [--device cpu] [--dtype float32] [--naive-blocks 2]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from playground.config import ModelSettings
from playground.engine.attribution.patching import Patcher, changed_positions, logit_diff, patch_map_rows
from playground.engine.attribution.salience import salience_events
from playground.events.salience import SalienceAgreement, SalienceMap
from playground.models.default_model import fetch_default_model
from playground.models.loading import load_model

CLEAN_20 = "As we learned at school, the capital of France is a city of light, and its name is"
CORRUPTED_20 = CLEAN_20.replace("France", "Italy")


def naive_row(patcher: Patcher, kind: str, layer: int, clean, corrupted, ids) -> list[float]:
    """One full forward per position with a hook writing the clean activation: the cost patching avoids."""
    block = patcher.anatomy.layer(layer)
    out = []
    for p in range(len(ids)):
        if kind == "residual":
            def pre(_m, args, kwargs, p=p):
                h = (args[0] if args else kwargs["hidden_states"]).clone()
                h[0, p] = clean.resid[layer][p]
                return ((h, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": h})
            handle = block.module.register_forward_pre_hook(pre, with_kwargs=True)
        else:
            module = block.attention.output if kind == "attention" else block.mlp.output

            def post(_m, _a, o, p=p):
                o = o.clone()
                o[0, p] = clean.of(kind)[layer][p]
                return o
            handle = module.register_forward_hook(post)
        try:
            with torch.inference_mode():
                out.append(patcher.model(torch.tensor([ids], device=patcher.lm.device)).logits[0, -1])
        finally:
            handle.remove()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--naive-blocks", type=int, default=2)
    args = parser.parse_args()
    fetch_default_model()
    lm = load_model(ModelSettings(device=args.device, dtype=args.dtype))
    tok = lm.tokenizer
    clean_ids, corrupted_ids = tok(CLEAN_20)["input_ids"], tok(CORRUPTED_20)["input_ids"]
    assert len(clean_ids) == len(corrupted_ids), (len(clean_ids), len(corrupted_ids))
    patcher = Patcher(lm)
    clean, corrupted = patcher.record(clean_ids), patcher.record(corrupted_ids)
    answer, foil = int(clean.logits.argmax()), int(corrupted.logits.argmax())
    print(f"{lm.name} on {lm.device} ({lm.dtype_name}), {patcher.layers} blocks, {len(clean_ids)} tokens; answer "
          f"{tok.decode([answer])!r} vs foil {tok.decode([foil])!r}; torch threads {torch.get_num_threads()}")
    print(f"logit difference clean {float(logit_diff(clean.logits, answer, foil)):.3f}, corrupted "
          f"{float(logit_diff(corrupted.logits, answer, foil)):.3f}")
    for kind in ("residual", "attention", "mlp"):
        start, cpu = time.perf_counter(), time.process_time()
        rows = list(patch_map_rows(patcher, kind, clean, corrupted, answer, foil))
        batched, batched_cpu = time.perf_counter() - start, time.process_time() - cpu
        computed = sum(len(changed_positions(clean, corrupted, kind, n)) for n in range(patcher.layers))
        start = time.perf_counter()
        for layer in range(args.naive_blocks):
            naive_row(patcher, kind, layer, clean, corrupted, clean_ids)
        naive = (time.perf_counter() - start) / args.naive_blocks * patcher.layers
        best = max(rows, key=lambda r: max(r[1]))
        print(f"{kind:9s} map: {batched:6.1f} s batched (CPU {batched_cpu:.1f} s; {patcher.layers} passes, "
              f"{computed} of {patcher.layers * len(clean_ids)} cells computed, the rest equal in both runs); naive "
              f"(estimate from {args.naive_blocks} blocks) {naive:6.1f} s; ratio {naive / batched:4.1f}x; most "
              f"recovered {max(best[1]):.2f} at block {best[0]}")
    prompt = tok(CLEAN_20)["input_ids"]
    for event in salience_events(lm, prompt, [answer], 0):
        if isinstance(event, SalienceMap):
            top = sorted(range(len(event.scores)), key=lambda i: -event.scores[i])[:3]
            print(f"salience {event.method:22s} {event.seconds:5.1f} s; top tokens "
                  + ", ".join(f"{event.tokens[i]!r} {event.scores[i]:+.2f}" for i in top))
        elif isinstance(event, SalienceAgreement):
            print("rank correlations: " + "; ".join(f"{a} ~ {b}: ρ {r:+.2f}"
                                                    for (a, b), r in zip(event.pairs, event.rho, strict=True)))


if __name__ == "__main__":
    main()
