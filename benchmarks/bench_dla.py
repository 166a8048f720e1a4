"""Logit attribution's cost on the default model, side by side in one process: attributing one step, and every step
of the run (one forward pass either way), against the run's own greedy steps and a bare forward pass over the same
sequence (no hooks). Wall and CPU (this thread's) time, median over repeats. Goal: one step's attribution ≤ 1.5× the
bare forward pass (the hooks and the float64 maths on one position are small beside the model).

    .venv/bin/python benchmarks/bench_dla.py [--repeats 5] [--device cpu] [--dtype auto]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from playground.config import ModelSettings
from playground.engine.dla.run import attribute_run
from playground.engine.strategies import run_strategy
from playground.events import RunStarted, TokenStep
from playground.models.default_model import fetch_default_model
from playground.models.loading import load_model
from playground.presets import load_preset

GOAL = 1.5


def timed(call, repeats: int) -> tuple[float, float]:
    walls, cpus = [], []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.thread_time()
        call()
        walls.append((time.perf_counter() - wall) * 1000)
        cpus.append((time.thread_time() - cpu) * 1000)
    return statistics.median(walls), statistics.median(cpus)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="auto")
    args = parser.parse_args()
    lm = load_model(ModelSettings(path=str(fetch_default_model()), device=args.device, dtype=args.dtype))
    settings = load_preset("why-paris").settings
    events = list(run_strategy(lm, settings))
    prompt = next(e for e in events if isinstance(e, RunStarted)).prompt_token_ids
    steps = [e for e in events if isinstance(e, TokenStep)]
    ids = torch.tensor([list(prompt) + [s.token_id for s in steps]], device=lm.device)

    def bare() -> None:
        with torch.inference_mode():
            lm.model(input_ids=ids, use_cache=False)

    rows = [("greedy step (the run's median step_ms)", statistics.median(s.step_ms for s in steps[1:]), None),
            ("bare forward pass, whole sequence", *timed(bare, args.repeats)),
            ("attribute the last step", *timed(lambda: list(attribute_run(lm, prompt, steps, (len(steps) - 1,))),
                                               args.repeats)),
            (f"attribute all {len(steps)} steps", *timed(lambda: list(attribute_run(lm, prompt, steps, None)),
                                                       args.repeats))]
    base = rows[1][1]
    print(f"{lm.name} on {lm.device}, {ids.shape[1]} tokens, {args.repeats} repeats")
    for name, wall, cpu in rows:
        cpu_text = f"{cpu:8.1f} ms CPU" if cpu is not None else " " * 15
        print(f"{name:42s} {wall:8.1f} ms wall {cpu_text}  {wall / base:5.2f}x the bare pass")
    bare_cpu, one_cpu = rows[1][2], rows[2][2]
    ratio = one_cpu / bare_cpu if one_cpu is not None and bare_cpu else float("nan")
    print(f"goal: one step's attribution <= {GOAL}x the bare pass (CPU, steadier on a shared machine): {ratio:.2f}x, "
          f"{'met' if ratio <= GOAL else 'MISSED'}")


if __name__ == "__main__":
    main()
