"""The n-gram ban's cost per decode step: the engine's sampler (``NoRepeatNgram``: its index kept from step to step,
extended by ``accept``) against the whole-history tensor rescan it replaced (kept below for the comparison), on a
random history of ``--history`` tokens growing by one token a step (alphabet 400: bans occur), vocabulary 49152
(SmolLM2's), n = 3; then 8 beams whose rows each step continue a drawn parent. Whole passes of the two alternate
and the fastest of each is reported (a shared machine's noise only slows a pass). Both give the same logits
(checked on every step first).

    PYTHONPATH=. .venv/bin/python benchmarks/bench_ngram.py [--history 500] [--steps 200]
"""

from __future__ import annotations

import argparse
import time

import torch

from playground.engine.samplers.no_repeat_ngram import NoRepeatNgram


def rescan(ids: torch.Tensor, logits: torch.Tensor, n: int) -> torch.Tensor:
    """The engine's ban before: every window of the whole history compared with the suffix, each step."""
    seq_len = ids.shape[1]
    if seq_len < n:
        return logits
    windows = ids.unfold(1, n, 1)
    suffix = ids[:, seq_len - n + 1:]
    matches = (windows[..., :-1] == suffix.unsqueeze(1)).all(dim=-1)
    rows, at = matches.nonzero(as_tuple=True)
    out = logits.clone()
    out[rows, windows[rows, at, -1]] = float("-inf")
    return out


def passes(steps: list[tuple[torch.Tensor, int | None]], logits: torch.Tensor, n: int, repeats: int
           ) -> tuple[float, float]:
    """The fastest of ``repeats`` whole passes over ``steps`` (ids, the token accepted after: None for beams) of the
    rescan and of a fresh sampler, alternating: (rescan, sampler) microseconds per step. The first step is left out
    of both (the sampler indexes the whole prompt there, once a run; ``first_call`` times it)."""
    best_old = best_new = float("inf")
    for repeat in range(repeats):
        for which in ((0, 1) if repeat % 2 else (1, 0)):
            sampler = NoRepeatNgram(n)
            sampler.apply(steps[0][0], logits)
            begin = time.perf_counter()
            for ids, chosen in steps[1:]:
                if which == 0:
                    rescan(ids, logits, n)
                else:
                    sampler.apply(ids, logits)
                    if chosen is not None:
                        sampler.accept(chosen, 1.0)
            spent = (time.perf_counter() - begin) * 1e6 / (len(steps) - 1)
            if which == 0:
                best_old = min(best_old, spent)
            else:
                best_new = min(best_new, spent)
    return best_old, best_new


def first_call(ids: torch.Tensor, logits: torch.Tensor, n: int) -> float:
    """Milliseconds of a fresh sampler's first call (the prompt indexed), the fastest of 3."""
    best = float("inf")
    for _ in range(3):
        begin = time.perf_counter()
        NoRepeatNgram(n).apply(ids, logits)
        best = min(best, (time.perf_counter() - begin) * 1000)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--history", type=int, default=500)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("-n", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    n, start = args.n, args.history
    history = torch.randint(0, 400, (1, start + args.steps + 1), generator=g)
    logits = torch.randn(1, 49152, generator=g)
    one_row = [(history[:, :length], int(history[0, length])) for length in range(start, start + args.steps)]
    sampler = NoRepeatNgram(n)
    for ids, chosen in one_row:  # the same logits as the rescan, every step
        assert torch.equal(sampler.apply(ids, logits), rescan(ids, logits, n))
        sampler.accept(chosen, 1.0)
    rows, beam_steps = history[:, :start].repeat(8, 1), []
    for _ in range(args.steps // 4):  # 8 beams, each step every row the child of a drawn parent
        parents = torch.randint(0, 8, (8,), generator=g)
        rows = torch.cat([rows[parents], torch.randint(0, 400, (8, 1), generator=g)], dim=1)
        beam_steps.append((rows, None))
    wide, beams = logits.repeat(8, 1), NoRepeatNgram(n)
    for ids, _ in beam_steps:
        assert torch.equal(beams.apply(ids, wide), rescan(ids, wide, n))
    old, new = passes(one_row, logits, n, args.repeats)
    beam_old, beam_new = passes(beam_steps, wide, n, args.repeats)
    print(f"n = {n}, history {start} tokens (fastest of {args.repeats} passes): one row {old:.0f} us/step before "
          f"(rescan), {new:.0f} after (indexed); 8 beams {beam_old:.0f} before, {beam_new:.0f} after; the first "
          f"call (indexing the prompt) {first_call(one_row[0][0], logits, n):.1f} ms")


if __name__ == "__main__":
    main()
