"""The steering sweep (``--steer FILE --steer-sweep=-2,-1,1,2``): the same prompt decoded unsteered and at each
strength, side by side, each output scored against the unsteered model.

Every pane runs the strategy's own runner under ``--steer``'s wrapper (which holds the hooks on the model only
while that pane's generator computes an event, so the interleaved panes never see each other's steering), every
vector at the pane's strength; pane 0 is strength 0 (the unsteered reference: its events are the run's own, so the
tokens and steering views show the unsteered text and its representation reading). The live slider does not
apply to a sweep (each pane keeps its strength).

At the end, per pane, two teacher-forced passes over prompt + output: the unsteered model's and the model steered
at the pane's strength. From them (``sweep_figures``): the mean over the output's tokens of KL(steered ‖
unsteered) of the two next-token distributions, in nats, and the output's perplexity under the unsteered model,
exp(−mean log p_unsteered(token)). Events: the compare strategy's (``PaneStarted``/``PaneToken``/``PaneFinished``,
figures ``strength``, ``mean_kl``, ``perplexity``, ``log_likelihood``, ``mean_logprob`` and the output figures).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

import torch

from playground.config import RunSettings
from playground.config.steering import SteeringSettings
from playground.config.steering_sweep import SteeringSweepSettings
from playground.engine.compare.panes import interleave, pane_token
from playground.engine.forward import keep_last_logits
from playground.engine.run_context import RunContext
from playground.engine.steering.hooks import SteeringHooks
from playground.engine.steering.run import steering_vectors
from playground.engine.steering.vector import SteeringVector
from playground.events import Event, RunFinished, RunStarted, TokenStep
from playground.events.figures import output_figures
from playground.events.panes import PaneFinished, PaneStarted
from playground.models.loaded import LoadedModel


def sweep_strengths(settings: RunSettings) -> tuple[float, ...]:
    """The panes' strengths: 0 (the unsteered reference) first, then the sweep's in its order."""
    return (0.0, *settings.group(SteeringSweepSettings).strengths())


def pane_label(strength: float) -> str:
    return "unsteered (strength 0)" if strength == 0 else f"strength {strength:+g}"


def at_strength(settings: RunSettings, strength: float) -> RunSettings:
    """``settings`` with every ``--steer`` vector at ``strength`` and no sweep (one pane's run)."""
    steering = settings.group(SteeringSettings)
    specs = tuple(f"{path}:{strength!r}" for path, _ in steering.specs())
    groups = tuple(dataclasses.replace(g, steer=specs) if isinstance(g, SteeringSettings) else g
                   for g in settings.groups if not isinstance(g, SteeringSweepSettings))
    return settings.replace(groups=groups)


def sweep_vectors(lm: LoadedModel, settings: RunSettings) -> tuple[list[SteeringVector], tuple[int, ...]]:
    """The run's vectors (within ``--steer-layers``) and the blocks they steer, checked against the model."""
    steering = settings.group(SteeringSettings)
    span = steering.layer_range()
    vectors = [vector.within(span) for _, vector, _ in steering_vectors(lm, steering)]
    return vectors, tuple(sorted({n for v in vectors for n in v.layers}))


def sweep_figures(steered_logits: torch.Tensor, unsteered_logits: torch.Tensor, ids: Sequence[int]
                  ) -> tuple[float, float, float]:
    """Over an output's tokens: the mean KL(steered ‖ unsteered) of the next-token distributions (nats), the
    perplexity under the unsteered model and the unsteered log-likelihood (nats). Logits: [tokens, vocab], row i
    the distributions that predicted ``ids[i]``."""
    if not ids:
        return 0.0, 1.0, 0.0
    steered = torch.log_softmax(steered_logits.double(), dim=-1)
    unsteered = torch.log_softmax(unsteered_logits.double(), dim=-1)
    kl = (steered.exp() * (steered - unsteered)).sum(dim=-1)  # [tokens]
    chosen = unsteered.gather(1, torch.tensor(list(ids), device=unsteered.device)[:, None])[:, 0]
    log_likelihood = float(chosen.sum())
    return float(kl.mean()), float(torch.exp(-chosen.mean())), log_likelihood


def score_pane(lm: LoadedModel, vectors: Sequence[SteeringVector], layers: tuple[int, ...], strength: float,
               prompt_ids: Sequence[int], ids: Sequence[int]) -> tuple[float, float, float]:
    """``sweep_figures`` of one pane's output, from two teacher-forced passes (steered at ``strength``, unsteered)."""
    if not ids:
        return sweep_figures(torch.zeros(0, 1), torch.zeros(0, 1), ids)
    keep = len(ids) + 1  # the positions that predict ``ids`` (the last one, predicting past them, is dropped)
    kept = keep_last_logits(lm.model, keep)  # no [prompt, vocab] logits nobody reads
    with torch.inference_mode():
        full = torch.tensor([[*prompt_ids, *ids]], device=lm.device)
        unsteered = lm.model(full, use_cache=False, **kept).logits[0, -keep:-1].float()
        if strength == 0.0:
            return sweep_figures(unsteered, unsteered, ids)
        hooks = SteeringHooks(lm.model, vectors, tuple(strength for _ in vectors), layers)
        hooks.norms_done = True  # nothing to measure: only the steered distributions
        with hooks.installed(), hooks.active():
            steered = lm.model(full, use_cache=False, **kept).logits[0, -keep:-1].float()
    return sweep_figures(steered, unsteered, ids)


def run_sweep(runner, lm: LoadedModel, settings: RunSettings, context: RunContext | None = None
              ) -> Iterator[Event]:
    """``--steer-sweep``'s wrapper: ``runner`` (the strategy under ``--steer``'s wrapper) once per strength, side
    by side. The vectors are read and every pane's settings checked before the first event."""
    context = RunContext.of(context)
    pane_context = dataclasses.replace(context, steering=None, chooser=None)  # every pane keeps its strength
    strengths = sweep_strengths(settings)
    vectors, layers = sweep_vectors(lm, settings)
    panes = [at_strength(settings, s) for s in strengths]
    for pane in panes:
        pane.validate()
    streams = [runner(lm, pane, pane_context) for pane in panes]
    return _sweep(lm, settings, strengths, vectors, layers, streams, context)


def _sweep(lm: LoadedModel, settings: RunSettings, strengths: tuple[float, ...], vectors: list[SteeringVector],
           layers: tuple[int, ...], streams: list[Iterator[Event]], context: RunContext) -> Iterator[Event]:
    done: list[RunFinished | None] = [None] * len(streams)
    prompt_ids: tuple[int, ...] = ()
    strategy = settings.strategy
    for i, event in interleave(streams):
        if isinstance(event, RunStarted):
            if i == 0:
                prompt_ids = event.prompt_token_ids
                yield dataclasses.replace(event, settings=settings.as_plain_dict(
                    include=(SteeringSettings, SteeringSweepSettings)))
                for j, s in enumerate(strengths):
                    yield PaneStarted(pane=j, label=pane_label(s), summary=f"{strategy} · {pane_label(s)}",
                                      strategy=strategy, model_name=lm.name)
        elif isinstance(event, RunFinished):
            done[i] = event
        else:
            if isinstance(event, TokenStep):
                yield pane_token(i, event)
            if i == 0:
                yield event
    finished = [d for d in done if d is not None]
    if len(finished) != len(streams):
        raise RuntimeError("a sweep pane ended without its final event")
    stopped = context.stopped()
    reference = finished[0].token_ids
    for i, (strength, d) in enumerate(zip(strengths, finished, strict=True)):
        figures = output_figures(d.token_ids, reference, d.decode_ms)
        figures["strength"] = strength
        if not stopped:  # Stop: no scoring passes
            mean_kl, perplexity, log_likelihood = score_pane(lm, vectors, layers, strength, prompt_ids, d.token_ids)
            figures.update(mean_kl=mean_kl, perplexity=perplexity, log_likelihood=log_likelihood,
                           mean_logprob=log_likelihood / len(d.token_ids) if d.token_ids else 0.0)
        yield PaneFinished(pane=i, token_ids=d.token_ids, text=d.text, stop_reason=d.stop_reason,
                           tokens_per_s=d.tokens_per_s, decode_ms=d.decode_ms, figures=figures)
    cut_short = [name for d in finished for name in d.cut_short]
    if stopped:
        cut_short.append("sweep_scores")
    yield dataclasses.replace(finished[0], figures={**finished[0].figures, "panes": float(len(streams))},
                              stop_reason="stopped" if stopped else finished[0].stop_reason,
                              cut_short=tuple(dict.fromkeys(cut_short)))
