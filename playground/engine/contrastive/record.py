"""One contrastive step: from the expert's and the amateur's logits to the chosen token, and the step's events."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from playground.config import ContrastiveSettings
from playground.engine.contrastive.dola import penalise_repeats
from playground.engine.contrastive.scores import Contrast, contrast
from playground.engine.processors import NamedTransform
from playground.engine.sampling import sample_next_token
from playground.engine.step_analysis import StepAnalysis
from playground.events.contrastive import ContrastCandidate, ContrastStep

PLAUSIBILITY = "plausibility"  # the stage name of the cut in a token event's processor effects (``cut_by``)


@dataclass
class Choice:
    raw: torch.Tensor  # [vocab] the expert's raw logits
    stages: list[tuple[str, torch.Tensor]]  # [1, vocab] after each penalty, the contrast, each sampler transform
    contrast: Contrast
    processed: torch.Tensor  # [1, vocab] the scores after the sampler's transforms (the scores when greedy)
    probs: torch.Tensor  # [1, vocab] softmax of ``processed``: the normalised contrast distribution
    token_id: int  # the contrast's choice
    expert_token_id: int  # the expert's own top token (after the penalties)


def choose(logits: torch.Tensor, amateur_logits: torch.Tensor, ids: torch.Tensor,
           penalties: tuple[NamedTransform, ...], sampler: tuple[NamedTransform, ...],
           settings: ContrastiveSettings, generator: torch.Generator, score_penalty: float = 1.0,
           rule: Callable[[torch.Tensor, torch.Tensor, float, float], Contrast] = contrast) -> Choice:
    """``logits`` [vocab] the expert's raw logits, ``amateur_logits`` [vocab_a], ``ids`` [1, n] the text so far;
    ``score_penalty``: DoLa's repetition penalty on the contrast scores (1 = none); ``rule``: the amateur's contrast
    (the cut and the scores; DoLa's reference variant has its own)."""
    stages = []
    expert = logits[None]  # [1, vocab]
    for transform in penalties:
        expert = transform.apply(ids, expert)
        stages.append((transform.name, expert))
    result = rule(expert[0], amateur_logits, settings.alpha, settings.amateur_temperature)
    result.scores = penalise_repeats(result.scores, ids, score_penalty)
    processed = result.scores[None]
    stages.append((PLAUSIBILITY, processed))
    for transform in sampler:
        processed = transform.apply(ids, processed)
        stages.append((transform.name, processed))
    probs = processed.softmax(dim=-1)
    token = sample_next_token(probs, generator) if settings.contrast_sample else int(processed[0].argmax())
    return Choice(logits, stages, result, processed, probs, token, int(result.expert_logprobs.argmax()))


def recorded_ids(choice: Choice, token_id: int, top: int) -> tuple[list[int], int]:
    """The tokens a step records: the expert's top ``top``, the ``top`` best-scoring plausible tokens, the chosen
    one and the contrast's own choice, in the expert's order; and how many plausible tokens there are."""
    c = choice.contrast
    plausible = int(c.plausible.sum())
    expert_top = torch.topk(c.expert_logprobs, min(top, c.expert_logprobs.shape[-1])).indices.tolist()
    score_top = torch.topk(c.scores, min(top, plausible)).indices.tolist()
    wanted = dict.fromkeys([*expert_top, *score_top, token_id, choice.token_id])
    return list(wanted), plausible


def step_events(choice: Choice, token_id: int, step: int, forced: bool, top: int, token_text: Callable[[int], str],
                amateur_ms: float, contrast_ms: float, premature_layer: int = -1,
                layer_jsd: tuple[float, ...] = ()) -> tuple[ContrastStep, StepAnalysis]:
    """The step's ``ContrastStep`` and the analysis its ``TokenStep`` is made from (``token_id``: the token the
    text continues with, forced or the contrast's)."""
    c = choice.contrast
    ids, plausible = recorded_ids(choice, token_id, top)
    index = torch.tensor(ids, device=c.scores.device)
    expert = c.expert_logprobs[index]
    # Ranks under the expert: the number of tokens strictly more likely, plus one.
    ranks = ((c.expert_logprobs[None, :] > expert[:, None]).sum(dim=-1) + 1).tolist()
    rows = zip(ids, expert.tolist(), c.amateur_logprobs[index].tolist(), c.scores[index].tolist(),
               c.plausible[index].tolist(), ranks, choice.probs[0, index].tolist(), strict=True)
    candidates = sorted((ContrastCandidate(token_id=t, text=token_text(t), expert_logprob=e, amateur_logprob=a,
                                           score=s, plausible=p, expert_rank=r, prob=q)
                         for t, e, a, s, p, r, q in rows), key=lambda x: (x.expert_rank, x.token_id))
    event = ContrastStep(
        step=step, candidates=tuple(candidates), cut_logprob=c.cut_logprob, plausible_count=plausible,
        token_id=token_id, text=token_text(token_id), expert_token_id=choice.expert_token_id,
        expert_text=token_text(choice.expert_token_id), changed=choice.token_id != choice.expert_token_id,
        forced=forced, contrast_token_id=choice.token_id, amateur_ms=amateur_ms, contrast_ms=contrast_ms,
        premature_layer=premature_layer, layer_jsd=layer_jsd)
    raw = choice.raw[None]
    penalised = choice.stages[0][0] != PLAUSIBILITY  # without penalties the expert's log-probs are the raw ones
    raw_logprobs = raw.log_softmax(dim=-1) if penalised else c.expert_logprobs[None]
    analysis = StepAnalysis(
        raw_logits=raw, raw_logprobs=raw_logprobs, stage_logits=list(choice.stages), processed_logits=choice.processed,
        processed_probs=choice.probs, top_ids=torch.topk(choice.raw, min(top, raw.shape[-1])).indices.tolist(),
        token_id=token_id)
    return event, analysis
