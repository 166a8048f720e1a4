"""Train the tuned lens for the default model (or --model) on the shipped calibration text, save it in the user
cache (where ``--lens-kind tuned`` finds it), and report each layer's held-out KL to the last layer's distribution
(the evaluation text, never trained on) under the logit lens and the tuned lens, with the time it took.

    .venv/bin/python benchmarks/train_tuned_lens.py [--steps 40] [--lr 3e-3] [--tokens 4096] [--model PATH]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--model", default=None)
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args()

    from playground.config import ModelSettings
    from playground.engine.layers.lens import LayerStack
    from playground.engine.layers.tuned import (
        calibration_ids,
        collect_hidden,
        lens_kl,
        lens_path_of,
        save_tuned_lens,
        train_tuned_lens,
    )
    from playground.models.loading import load_model

    lm = load_model(ModelSettings(device="cpu", dtype="float32", path=args.model))
    stack = LayerStack.of(lm.model)
    load = os.getloadavg()[0]
    start = time.perf_counter()
    hidden, final = collect_hidden(stack, calibration_ids(lm.tokenizer, "calibration", args.tokens))
    held_h, held_f = collect_hidden(stack, calibration_ids(lm.tokenizer, "evaluation", 512))
    collected = time.perf_counter() - start
    training = train_tuned_lens(stack, hidden, final, steps=args.steps, lr=args.lr)
    while True:
        try:
            progress = next(training)
        except StopIteration as done:
            lens = done.value
            break
        if progress.step % 10 == 0 or progress.step == args.steps:
            print(f"step {progress.step}/{progress.steps}: mean KL {progress.loss:.3f} nats, "
                  f"{progress.elapsed_s:.0f} s", flush=True)
    took = time.perf_counter() - start
    lens.info.update({"model": lm.name, "steps": str(args.steps), "lr": str(args.lr),
                      "tokens": str(hidden.shape[1])})
    if not args.no_save:
        print("saved", save_tuned_lens(lens, lens_path_of(lm.model, stack.count)))
    before, after = lens_kl(stack, None, held_h, held_f), lens_kl(stack, lens, held_h, held_f)
    print(f"{lm.name}: {hidden.shape[1]} training tokens, {held_h.shape[1]} held-out; collecting {collected:.0f} s, "
          f"all {took:.0f} s; load average at start {load:.1f} on {os.cpu_count()} CPUs")
    print("layer  logit-lens KL  tuned-lens KL  reduction")
    for layer, (b, a) in enumerate(zip(before, after, strict=True), start=1):
        print(f"{layer:5d}  {b:13.3f}  {a:13.3f}  {1 - a / b:9.1%}")
    lower = sum(a < b for b, a in zip(before, after, strict=True))
    print(f"tuned lower on {lower} of {len(before)} layers below the last")


if __name__ == "__main__":
    main()
