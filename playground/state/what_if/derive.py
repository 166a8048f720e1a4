"""Re-deriving a run under other settings: the declared samplers' stages in the run's order over every step at
once, mirostat's mu iterated to its fixed point, the result as ``WhatIf``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from playground.config import RunSettings
from playground.config.catalog import STRATEGIES
from playground.config.samplers import active_samplers
from playground.state.what_if.bounds import _MIROSTAT, _NOT_RECORDED, _TAIL_WEIGHT, REASONS, WhatIf, _Chain
from playground.state.what_if.recorded import RecordedRun
from playground.state.what_if.stages import STAGES

NEG_INF = -np.inf


def re_derive(run: RecordedRun, settings: RunSettings, *, sampling: bool | None = None,
              encode: Callable[[str], Sequence[int]] | None = None,
              breaker_ids: frozenset[int] | None = None) -> WhatIf:
    """Re-derive every step of ``run`` (``RecordedRun.of(steps, prompt_ids)``) under ``settings`` (their samplers
    and order; ``sampling``: whether the sampling-only samplers apply, by default when the strategy is "sample", as
    ``build_pipeline`` decides).

    ``encode``: a word's token ids (a logit bias on a word); ``breaker_ids``: DRY's breakers as token ids (every
    token whose text holds one, as the engine reads them). Without them such a step is marked not exact.
    """
    with np.errstate(all="ignore"):  # -inf marks removed tokens throughout: its arithmetic is meant
        return _re_derive(run, settings, sampling, encode, breaker_ids)


def _re_derive(run: RecordedRun, settings: RunSettings, sampling: bool | None,
               encode: Callable[[str], Sequence[int]] | None, breaker_ids: frozenset[int] | None) -> WhatIf:
    if sampling is None:  # the strategy's catalog entry says whether it reads the sampling settings
        strategy = STRATEGIES.get(settings.strategy)
        sampling = strategy is not None and "sampling" in strategy.sections
    names = active_samplers(settings, sampling)
    follows = [n for n in names if n in STAGES and STAGES[n].feedback is not None]
    if not follows:
        return _chain_once(run, settings, names, encode, breaker_ids, None)
    # A stage whose state follows the chosen tokens' final probabilities (mirostat's mu): start it from its first
    # value everywhere, derive, recompute the state from the chosen tokens' probabilities, and again until it stops
    # moving. Step 0's state is exact from the start and each pass fixes at least one more, so the fixed point is
    # the sequential answer; steps whose state still moved after the last pass are marked not exact.
    entry = STAGES[follows[0]]
    assert entry.feedback is not None
    state = entry.feedback(np.zeros(0), settings, len(run.steps))
    before = _Progress(_Chain(run), [], np.full(run.x.shape, -1, dtype=np.int16))
    _run_stages(before, run, settings, names[:names.index(follows[0])], encode, breaker_ids)  # once for all passes
    for _ in range(MIROSTAT_PASSES):
        result = _chain_once(run, settings, names, encode, breaker_ids, state, before)
        following = entry.feedback(result.chosen_prob, settings, len(run.steps))
        moved = following != state
        if not moved.any():
            break
        # Past the first step that is not exact every state is marked not exact anyway: no pass can change that.
        first_moved, first_inexact = int(np.argmax(moved)), int(np.argmin(result.exact))
        if not result.exact.all() and first_moved > first_inexact:
            break
        state = following
    else:
        result = _chain_once(run, settings, names, encode, breaker_ids, state, before)
    # A step's state is only as exact as every earlier step's chosen probability.
    earlier = np.concatenate([[False], np.cumsum(~result.exact)[:-1] > 0])
    unsettled = (entry.feedback(result.chosen_prob, settings, len(run.steps)) != state) | earlier
    reasons = tuple(REASONS[_MIROSTAT] if bad and not why else why for bad, why in zip(unsettled, result.reasons,
                                                                                         strict=True))
    return dataclasses.replace(result, exact=result.exact & ~unsettled, reasons=reasons)


MIROSTAT_PASSES = 8  # the passes of a stage that follows the chosen tokens (mirostat)


def _chain_once(run: RecordedRun, settings: RunSettings, names: list[str],
                encode: Callable[[str], Sequence[int]] | None, breaker_ids: frozenset[int] | None,
                mu: np.ndarray | None, start: _Progress | None = None) -> WhatIf:
    """The chain over every step; ``start``: the chain after the stages before the one that follows the chosen
    tokens, already run; ``mu``: that stage's state per step (mirostat's mu)."""
    progress = start.copy() if start is not None else _Progress(_Chain(run), [],
                                                                 np.full(run.x.shape, -1, dtype=np.int16))
    progress.chain.mu = mu
    _run_stages(progress, run, settings, names[len(progress.stages):], encode, breaker_ids)
    return _finish(progress, run)


@dataclasses.dataclass
class _Progress:
    """A chain part-way: its arrays, the stages run so far and what each cut."""

    chain: _Chain
    stages: list[str]
    cut_by: np.ndarray

    def copy(self) -> _Progress:
        chain = _Chain.__new__(_Chain)
        chain.__dict__.update({k: (v.copy() if isinstance(v, np.ndarray) else v)
                               for k, v in self.chain.__dict__.items()})
        return _Progress(chain, list(self.stages), self.cut_by.copy())


def _run_stages(progress: _Progress, run: RecordedRun, settings: RunSettings, names: list[str],
                encode: Callable[[str], Sequence[int]] | None, breaker_ids: frozenset[int] | None) -> None:
    chain, cut_by, stages = progress.chain, progress.cut_by, progress.stages
    for name in names:
        entry = STAGES.get(name)
        if entry is None:
            raise KeyError(f"the what-if has no stage for the sampler {name!r} (playground.state.what_if.stages)")
        label = entry.label(settings)
        before = np.isfinite(chain.x)
        entry.fn(chain, settings, run.context, run.start, run.steps, encode, breaker_ids)
        if not entry.scales:  # it may have changed the distribution: the recorded whole-vocabulary numbers are off
            chain.raw[:] = False
        rows, at = np.nonzero(before & ~np.isfinite(chain.x))  # a removed token never comes back
        cut_by[rows, chain.cols[rows, at]] = len(stages)
        stages.append(label)
        chain.compact()


def _finish(progress: _Progress, run: RecordedRun) -> WhatIf:
    chain = progress.chain
    # Unrecorded tokens still in play leave the recorded ones' probabilities exact when their total weight is known
    # (no temperature, no penalty on them: the bounds agree); a cut that may have kept some of them said so itself.
    chain.flag(chain.alive & (chain.hi - chain.lo > 1e-9), _TAIL_WEIGHT)
    chain.reason[~run.recorded] = _NOT_RECORDED
    x: np.ndarray = np.full(run.x.shape, NEG_INF)
    rows = np.arange(run.x.shape[0])
    x[rows[:, None], chain.cols] = chain.x
    probs = np.where(np.isfinite(x), np.exp(x - chain.log_z(chain.hi)), 0.0)
    kept = np.isfinite(x) & (run.ids >= 0)
    greedy = run.ids[rows, np.argmax(x, axis=1)] if x.shape[1] else run.chosen
    chosen_cut = ~kept[rows, run.chosen_col]
    tail_prob = np.where(chain.alive, np.exp(chain.hi - chain.log_z(chain.hi)[:, 0]), 0.0)
    return WhatIf(stages=tuple(progress.stages), ids=run.ids, probs=probs, cut_by=progress.cut_by, kept=kept,
                  tail_prob=tail_prob,
                  chosen=run.chosen, chosen_prob=probs[rows, run.chosen_col], chosen_cut=chosen_cut,
                  greedy=greedy, greedy_differs=greedy != run.chosen, exact=chain.reason == 0,
                  reasons=tuple(REASONS[int(r)] for r in chain.reason), mirostat_mu=chain.mu)
