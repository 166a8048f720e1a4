"""The quantization lab's run (``--quant METHOD --compare``): the reference and its quantized copy decode the same
prompt with the same strategy, settings and seed, side by side, while a teacher-forced scorer compares their
next-token distributions on the reference's tokens.

Events: the reference's own (``start`` with the run's settings, its tokens, ...), ``QuantReady``, a ``PaneStarted``
per model, ``PaneToken``s of both panes interleaved, a ``QuantStep`` after each reference token, ``PaneFinished`` for
each, ``QuantSummary``, ``done``. A step costs four incremental passes: each pane's own, and the scorer's two.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import torch

from playground.config import QuantSettings, RunSettings
from playground.engine.compare.panes import interleave, pane_finished, pane_token
from playground.engine.prompt import encode_prompt
from playground.engine.quant.teacher_forced import TeacherForcedScorer
from playground.engine.run_context import RunContext, StopCheck
from playground.engine.run_events import RunRecorder
from playground.events import Event, RunFinished, RunStarted, TokenStep
from playground.events.figures import first_divergence
from playground.events.panes import PaneStarted
from playground.events.quant import MethodRow, QuantReady, QuantStep, QuantSummary, QuantTable
from playground.models.loaded import LoadedModel


def run_quant_wrapper(runner, lm: LoadedModel, settings: RunSettings, context: RunContext | None = None
                      ) -> Iterator[Event]:
    """``--quant``'s wrapper of every strategy that takes it (``playground.config.catalog``): the lab
    (``--compare``: reference and copy side by side) or the strategy's ``runner`` on the quantized copy."""
    from playground.engine.quantized.apply import run_quantized

    if settings.group(QuantSettings).compare:
        return run_quant_compare(lm, settings, context)
    return run_quantized(runner, lm, settings, context)


def run_quant_compare(lm: LoadedModel, settings: RunSettings, context: RunContext | StopCheck | None = None
                      ) -> Iterator[Event]:
    """Validate, build the quantized copy (or take it from the cache, reporting ``progress``), return the run; Stop
    during the build returns a run that starts and ends "stopped" with ``cut_short=("quantized_copy",)``."""
    from playground.engine.quantized.apply import QuantCancelled, check_combination, quantized_lm
    from playground.engine.strategies import run_strategy

    context = RunContext.of(context)
    quant = settings.group(QuantSettings)
    base = settings.replace(groups=tuple(g for g in settings.groups if not isinstance(g, QuantSettings)))
    check_combination(settings)
    reference = run_strategy(lm, base, context)  # validates the strategy's own settings before any work
    try:
        qlm, ready = quantized_lm(lm, quant, context)
    except QuantCancelled as stopped:  # the lab ends "stopped" before its first token, saying what Stop cut
        getattr(reference, "close", lambda: None)()
        prompt_ids, prompt_text = encode_prompt(lm, base)
        record = RunRecorder(lm, settings, context, groups=(QuantSettings,))
        return record.stopped_before_start(prompt_ids, prompt_text, (stopped.cut,))
    except BaseException:
        getattr(reference, "close", lambda: None)()
        raise
    streams = [reference, run_strategy(qlm, base, context)]
    return _compare(lm, settings, quant, base, streams, qlm, ready)


def _compare(lm: LoadedModel, settings: RunSettings, quant: QuantSettings, base: RunSettings,
             streams: list[Iterator[Event]], qlm: LoadedModel, ready: QuantReady) -> Iterator[Event]:
    labels = (f"reference ({lm.dtype_name})", quant.summary().removesuffix(" vs reference"))
    done: list[RunFinished | None] = [None, None]
    scorer: TeacherForcedScorer | None = None
    steps: list[QuantStep] = []
    for i, event in interleave(streams):
        if isinstance(event, RunStarted):
            if i == 0:
                yield dataclasses.replace(event, settings=settings.as_plain_dict(include=(QuantSettings,)))
                yield ready
                for j, (label, model) in enumerate(((labels[0], lm), (labels[1], qlm))):
                    yield PaneStarted(pane=j, label=label, summary=label, strategy=base.strategy,
                                      model_name=model.name)
                scorer = TeacherForcedScorer(lm.model, qlm.model, lm.tokenizer, event.prompt_token_ids, lm.device)
        elif isinstance(event, RunFinished):
            done[i] = event
        elif i == 1:
            if isinstance(event, TokenStep):
                yield pane_token(1, event)
        elif not isinstance(event, QuantReady):
            yield event
            if isinstance(event, TokenStep):
                yield pane_token(0, event)
                assert scorer is not None  # made at the reference's start, which comes first
                steps.append(scorer.score(event.step, event.token_id))
                yield steps[-1]
    ref_done, quant_done = done
    if ref_done is None or quant_done is None:
        raise RuntimeError("a pane ended without its final event")
    yield pane_finished(0, ref_done, ref_done.token_ids, None, ())
    yield pane_finished(1, quant_done, ref_done.token_ids, None, ())
    summary = summarize(steps, ref_done, quant_done)
    yield summary
    yield remember(lm, ready, labels[1], summary)
    yield dataclasses.replace(ref_done, figures={**ref_done.figures, "kl_mean": summary.kl_mean,
                                                 "top1_agreement": summary.top1_agreement,
                                                 "first_divergence": float(summary.first_divergence)})


# Results of comparison runs, per model (its path and dtype) and method label: the lab's table across runs.
_RESULTS: dict[tuple[str, str], dict[str, MethodRow]] = {}


def remember(lm: LoadedModel, ready: QuantReady, label: str, summary: QuantSummary) -> QuantTable:
    """Keep this run's figures with the model's earlier ones and return the table of all of them."""
    rows = _RESULTS.setdefault((lm.path, lm.dtype_name), {})
    ppl = ready.perplexity
    rows["reference"] = MethodRow(
        method="reference", weight_bytes=ready.reference_weight_bytes, stored=ready.reference_dtype,
        perplexity=ppl.get("reference"), tokens_per_s=summary.reference_tokens_per_s, kl_mean=0.0,
        top1_agreement=1.0, first_divergence=-1)
    rows[label] = MethodRow(
        method=label, weight_bytes=ready.weight_bytes, stored=ready.stored, perplexity=ppl.get(ready.method),
        tokens_per_s=summary.quantized_tokens_per_s, kl_mean=summary.kl_mean,
        top1_agreement=summary.top1_agreement, first_divergence=summary.first_divergence)
    ordered = [rows["reference"], *(row for key, row in rows.items() if key != "reference")]
    return QuantTable(model_name=lm.name, rows=tuple(ordered))


def summarize(steps: list[QuantStep], reference: RunFinished, quantized: RunFinished) -> QuantSummary:
    """The run's statistics, computed as ``metrics.kl_stats`` computes them (torch's median and 0.99 quantile)."""
    kl = torch.tensor([s.kl for s in steps] or [0.0], dtype=torch.float64)
    return QuantSummary(
        kl_mean=float(kl.mean()), kl_median=float(kl.median()), kl_p99=float(torch.quantile(kl, 0.99)),
        kl_max=float(kl.max()),
        top1_agreement=sum(s.top1_agrees for s in steps) / len(steps) if steps else 1.0, tokens=len(steps),
        first_divergence=first_divergence(quantized.token_ids, reference.token_ids),
        reference_tokens_per_s=reference.tokens_per_s, quantized_tokens_per_s=quantized.tokens_per_s)
