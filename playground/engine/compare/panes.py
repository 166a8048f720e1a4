"""Side-by-side runs: several strategies (or models) decode the same prompt, advanced one step each in turn.

``interleave`` takes any strategies' event streams and advances each by one unit step (a token, a beam step) in
turn, so the panes grow together on screen. ``run_compare`` is the ``compare`` strategy: the first pane's events are
the run's own (its tokens view, its beam tree), every pane's tokens also arrive as ``PaneToken``, and each pane ends
with a ``PaneFinished`` carrying the figures measured on its output (and, for a ``kv-cache`` pane, its cache's:
the bytes held at the end and at the peak, and a cache that keeps less's quality against the full cache, from the
pane's own ``KVStep``/``KVQuality`` events, which only pane 0 passes on).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from playground.config import CompareSettings, RunSettings
from playground.config.words import pane_settings
from playground.engine.compare.likelihood import log_likelihood
from playground.engine.run_context import RunContext, StopCheck
from playground.events import Event, PrefillDone, RunFinished, RunStarted, TokenStep
from playground.events.figures import output_figures
from playground.events.kv import KVQuality, KVStep
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


class PaneKV:
    """What a ``kv-cache`` pane's own events say about its cache: bytes held after its prefill and every step
    (the last and the largest measured) and its quality against the full cache (a cache that keeps less)."""

    def __init__(self) -> None:
        self.held: int | None = None
        self.peak = 0
        self.quality: KVQuality | None = None

    def see(self, event: Event) -> None:
        if isinstance(event, KVStep):
            self.held, self.peak = event.total_bytes, max(self.peak, event.total_bytes)
        elif isinstance(event, PrefillDone):  # every strategy's; a kv-cache pane's counts toward its peak
            self.peak = max(self.peak, event.kv_cache_bytes)
        elif isinstance(event, KVQuality):
            self.quality = event

    def figures(self) -> dict[str, float]:
        if self.held is None:  # no KV steps: not a kv-cache pane (or one stopped before its first token)
            return {}
        out = {"kv_bytes": float(self.held), "kv_peak_bytes": float(self.peak)}
        if self.quality is not None:
            out.update(kv_mean_kl=self.quality.mean_kl, kv_top1_agreement=self.quality.agreement,
                       kv_first_divergence=float(self.quality.first_divergence))
        return out


def pane_finished(pane: int, done: RunFinished, reference_ids: Sequence[int], scorer: LoadedModel | None,
                  prompt_ids: Sequence[int], kv: PaneKV | None = None) -> PaneFinished:
    """A pane's end, with its figures; ``scorer``: the model its log-likelihood is measured under (None: skip);
    ``kv``: the pane's cache figures (a ``kv-cache`` pane)."""
    figures = output_figures(done.token_ids, reference_ids, done.decode_ms)
    if kv is not None:
        figures.update(kv.figures())
    if scorer is not None:
        figures["log_likelihood"] = log_likelihood(scorer, prompt_ids, done.token_ids)
        figures["mean_logprob"] = figures["log_likelihood"] / len(done.token_ids) if done.token_ids else 0.0
    return PaneFinished(pane=pane, token_ids=done.token_ids, text=done.text, stop_reason=done.stop_reason,
                        tokens_per_s=done.tokens_per_s, decode_ms=done.decode_ms, figures=figures)


def run_compare(lm: LoadedModel, settings: RunSettings, context: RunContext | StopCheck | None = None
                ) -> Iterator[Event]:
    """The ``compare`` strategy. Every pane is validated (and its strategy set up) before the first event."""
    from playground.engine.strategies import run_strategy

    specs = settings.group(CompareSettings).panes
    panes = [Pane(spec, lm, s) for spec, s in zip(specs, pane_settings(settings), strict=True)]
    context = RunContext.of(context)  # every pane's run shares it (its Stop, its history)
    streams = [run_strategy(p.lm, p.settings, context) for p in panes]
    return _compare(lm, settings, panes, streams, context)


def _compare(lm: LoadedModel, settings: RunSettings, panes: list[Pane], streams: list[Iterator[Event]],
             context: RunContext) -> Iterator[Event]:
    done: list[RunFinished | None] = [None] * len(panes)
    caches = [PaneKV() for _ in panes]
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
            caches[i].see(event)
            if isinstance(event, TokenStep):
                yield pane_token(i, event)
            if i == 0:
                yield event
    finished = [d for d in done if d is not None]
    if len(finished) != len(panes):  # a stream that ends without its final event is a bug in that strategy
        raise RuntimeError("a pane ended without its final event")
    cut_short = [name for d in finished for name in d.cut_short]
    stopped = context.stopped()
    scorer = lm if settings.group(CompareSettings).log_likelihood else None
    if scorer is not None and stopped:
        scorer = None  # Stop: no scoring pass over every output
        cut_short.append("log_likelihood")
    for i, d in enumerate(finished):
        yield pane_finished(i, d, finished[0].token_ids, scorer, prompt_ids, caches[i])
    yield dataclasses.replace(finished[0], figures={**finished[0].figures, "panes": float(len(panes))},
                              stop_reason="stopped" if stopped else finished[0].stop_reason,
                              cut_short=tuple(dict.fromkeys(cut_short)))
