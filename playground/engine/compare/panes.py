"""Side-by-side runs: several strategies (or models) decode the same prompt, advanced one step each in turn.

``interleave`` takes any strategies' event streams and advances each by one unit step (a token, a beam step) in
turn, so the panes grow together on screen. ``run_compare`` is the ``compare`` strategy: the first pane's events are
the run's own (its tokens view, its beam tree), every pane's tokens also arrive as ``PaneToken``, and each pane ends
with a ``PaneFinished`` carrying the figures measured on its output.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from playground.config import CompareSettings, RunSettings
from playground.config.words import pane_settings
from playground.engine.compare.likelihood import log_likelihood
from playground.events import Event, RunFinished, RunStarted, TokenStep
from playground.events.figures import output_figures
from playground.events.panes import PaneFinished, PaneStarted, PaneToken
from playground.models.loaded import LoadedModel


@dataclass(frozen=True)
class Pane:
    label: str
    lm: LoadedModel
    settings: RunSettings


def interleave(streams: Sequence[Iterator[Event]]) -> Iterator[tuple[int, Event]]:
    """(pane, event) from every stream, each advanced up to and including its next unit step, in turn.

    Every step of a stream runs inside our own ``torch.inference_mode()``: strategies enter that mode in their
    generators, and generators suspended inside it would otherwise leave it in each other's order (one pane's exit
    switching it off under another's feet, whose inference-mode cache then fails in a grad-mode forward)."""
    active = list(range(len(streams)))
    while active:
        for i in list(active):
            while True:
                with torch.inference_mode():
                    event = next(streams[i], None)
                if event is None:
                    active.remove(i)
                    break
                yield i, event
                if hasattr(type(event), "unit"):
                    break


def pane_token(pane: int, step: TokenStep) -> PaneToken:
    return PaneToken(pane=pane, step=step.step, token_id=step.token_id, text=step.text, prob=step.prob,
                     step_ms=step.step_ms)


def pane_finished(pane: int, done: RunFinished, reference_ids: Sequence[int], scorer: LoadedModel | None,
                  prompt_ids: Sequence[int]) -> PaneFinished:
    """A pane's end, with its figures; ``scorer``: the model its log-likelihood is measured under (None: skip)."""
    figures = output_figures(done.token_ids, reference_ids, done.decode_ms)
    if scorer is not None:
        figures["log_likelihood"] = log_likelihood(scorer, prompt_ids, done.token_ids)
        figures["mean_logprob"] = figures["log_likelihood"] / len(done.token_ids) if done.token_ids else 0.0
    return PaneFinished(pane=pane, token_ids=done.token_ids, text=done.text, stop_reason=done.stop_reason,
                        tokens_per_s=done.tokens_per_s, decode_ms=done.decode_ms, figures=figures)


def run_compare(lm: LoadedModel, settings: RunSettings, should_stop=None) -> Iterator[Event]:
    """The ``compare`` strategy. Every pane is validated (and its strategy set up) before the first event."""
    from playground.engine.strategies import run_strategy

    specs = settings.group(CompareSettings).panes
    panes = [Pane(spec, lm, s) for spec, s in zip(specs, pane_settings(settings), strict=True)]
    streams = [run_strategy(p.lm, p.settings, should_stop) for p in panes]
    return _compare(lm, settings, panes, streams, should_stop)


def _compare(lm: LoadedModel, settings: RunSettings, panes: list[Pane], streams: list[Iterator[Event]],
             should_stop=None) -> Iterator[Event]:
    done: list[RunFinished | None] = [None] * len(panes)
    prompt_ids: tuple[int, ...] = ()
    for i, event in interleave(streams):
        if isinstance(event, RunStarted):
            if i == 0:  # the run's own start: pane 0's prompt, the compare run's settings
                prompt_ids = event.prompt_token_ids
                yield dataclasses.replace(event, strategy=settings.strategy,
                                          settings=settings.as_plain_dict(include=(CompareSettings,)))
                for j, pane in enumerate(panes):
                    yield PaneStarted(pane=j, label=pane.label, summary=pane.label, strategy=pane.settings.strategy,
                                      model_name=pane.lm.name)
        elif isinstance(event, RunFinished):
            done[i] = event
        else:
            if isinstance(event, TokenStep):
                yield pane_token(i, event)
            if i == 0:
                yield event
    finished = [d for d in done if d is not None]
    if len(finished) != len(panes):  # a stream that ends without its final event is a bug in that strategy
        raise RuntimeError("a pane ended without its final event")
    cut_short = [name for d in finished for name in d.cut_short]
    stopped = should_stop is not None and should_stop()
    scorer = lm if settings.group(CompareSettings).log_likelihood else None
    if scorer is not None and stopped:
        scorer = None  # Stop: no scoring pass over every output
        cut_short.append("log_likelihood")
    for i, d in enumerate(finished):
        yield pane_finished(i, d, finished[0].token_ids, scorer, prompt_ids)
    yield dataclasses.replace(finished[0], figures={**finished[0].figures, "panes": float(len(panes))},
                              stop_reason="stopped" if stopped else finished[0].stop_reason,
                              cut_short=tuple(dict.fromkeys(cut_short)))
