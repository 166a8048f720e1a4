"""Diverse (group) beam search (Vijayakumar et al. 2016), as transformers 4.46's ``_group_beam_search`` computes it.

The ``num_beams`` beams are split into ``num_beam_groups`` groups of ``size = num_beams / num_beam_groups``; all
beams are expanded in one batched forward pass, then the groups are decided one after another within the step:

1. group ``g``'s log-probs (log-softmax of the raw logits) lose ``D x n(token)`` for every token, ``n`` being how many
   beams of the groups before ``g`` chose that token at this step (``HammingDiversityLogitsProcessor``; it comes
   before the other processors, as in 4.46's list); the processed log-probs plus the running scores rank the group's
   top ``K = max(2, 1 + n_eos) x size`` continuations, so the penalty enters the running beam score;
2. that group alone then does what plain beam search does (``playground.engine.beam``'s helpers with ``size`` beams):
   a continuation that picks EOS among the group's first ``size`` becomes a finished hypothesis of the group, the
   best ``size`` that did not are its next beams;
3. a group is done (4.46's ``BeamHypotheses.is_done``) once it holds ``size`` finished hypotheses and the best
   continuation of the step (EOS ones included) could not beat the worst of them; a done group's beams then
   copy its first beam and emit the pad token (which still counts for the later groups' penalty, as in 4.46);
4. the search ends when every group is done or at the length limit, where each group that is not done adds its
   running beams to its finished ones (4.46's ``finalize``); the result is the best hypotheses across all groups.

The search is one step of the shared decode loop (``playground.engine.beam.run_beam_search`` drives it, as it
drives plain beam search), so Stop, the budget, timing and the observers are the loop's. Each candidate of a step
event carries its group and the diversity penalty it paid. ``run_group_beam_search`` is the wrapper the settings
group declares (``playground.config.beam_groups``): it runs in beam search's place when the groups are on.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator

import torch

from playground.config import BeamSettings, QuantSettings, RunSettings
from playground.config.beam_groups import BeamGroupSettings
from playground.engine.beam import (
    MASKED,
    Expansion,
    Hypotheses,
    SearchShape,
    _pad_id,
    choose_running,
    expand_beams,
    extend_sequences,
    initial_state,
    merge_finished,
    parse_early_stopping,
    run_beam_search,
    to_sequences,
)
from playground.engine.decode import DecodeLoop, Picked
from playground.engine.kv_cache import kv_cache_bytes
from playground.engine.processors import NamedTransform, run_pipeline
from playground.engine.run_context import RunContext
from playground.engine.token_text import TokenTextCache
from playground.events import BeamSequence, Event
from playground.events.beam_groups import DiverseBeamCandidate, DiverseBeamStep
from playground.models.loaded import LoadedModel


def run_group_beam_search(runner: object, lm: LoadedModel, settings: RunSettings, context: RunContext
                          ) -> Iterator[Event]:
    """Beam search's run when ``--num-beam-groups`` / ``--diversity-penalty`` are set (``runner``, beam search's
    own, is replaced); with ``--quant`` too, the quantized copy runs this search (the wrappers compose here)."""
    if settings.group(QuantSettings).active():
        from playground.engine.quantized.compare import run_quant_wrapper

        return run_quant_wrapper(run_diverse_beam_search, lm, settings, context)
    return run_diverse_beam_search(lm, settings, context)


def run_diverse_beam_search(lm: LoadedModel, settings: RunSettings, context: RunContext | None = None
                            ) -> Iterator[Event]:
    """Diverse beam search as a generator of events (beam search's, with each candidate's group and penalty)."""
    return run_beam_search(lm, settings, context, search=GroupSearch)


def diversity_penalties(chosen: torch.Tensor, vocab: int, penalty: float) -> torch.Tensor:
    """``D x`` how often each token was chosen by the earlier groups' beams at this step: [vocab] (4.46's Hamming
    diversity); ``chosen``: [beams of the earlier groups] token ids."""
    return penalty * torch.bincount(chosen, minlength=vocab).to(torch.float32)


def group_done(finished: Hypotheses, best_score: torch.Tensor, length: int, shape: SearchShape) -> bool:
    """4.46's ``BeamHypotheses.is_done`` for one group: its ``size`` finished slots are full and the best
    continuation of the step (``best_score`` [1], cumulative, EOS ones included) cannot beat the worst of them;
    ``length``: prompt plus generated tokens after this step. Worst and best are normalised by the same float32
    operation (``merge_finished``'s), so that a best continuation that just finished, and is the worst, ties with
    itself and ends the group, as in 4.46 (which computes both sides in the same Python floats)."""
    if not bool(finished.done.all()):
        return False
    if shape.early_stopping is True:
        return True
    generated = length - shape.prompt_len
    if shape.early_stopping == "never" and shape.length_penalty > 0.0:
        generated = shape.max_length - shape.prompt_len
    return bool(finished.scores.min() >= (best_score / generated**shape.length_penalty)[0])


def admit_running(finished: Hypotheses, running: Hypotheses, cur_len: int, shape: SearchShape
                  ) -> tuple[Hypotheses, torch.Tensor]:
    """4.46's ``finalize`` for a group that is not done: its running beams (as they are after the token at
    ``cur_len``) join its finished hypotheses if they beat the worst; returns the set and which beams entered."""
    rows = running.scores.shape[0]
    as_candidates = Expansion(running.scores, running.scores, torch.arange(rows, device=running.scores.device),
                              running.sequences[:, cur_len],
                              torch.ones(rows, dtype=torch.bool, device=running.scores.device))
    return merge_finished(finished, as_candidates, running.sequences, cur_len, shape, improvable=True)


@dataclasses.dataclass
class GroupDecision:
    """What one group decided at a step (for its events)."""

    group: int
    expansion: Expansion
    survivors: torch.Tensor  # rows of the expansion that continue
    entered: torch.Tensor  # [K] bool: became a finished hypothesis
    penalties: torch.Tensor | None  # [vocab] the diversity penalty of each token, None for the first group


class GroupSearch:
    """Diverse beam search's state between steps, and its step for the decode loop (rows = all groups' beams,
    group ``g`` in rows ``g * size ... (g + 1) * size - 1``)."""

    def __init__(self, lm: LoadedModel, loop: DecodeLoop, settings: RunSettings,
                 pipeline: tuple[NamedTransform, ...]) -> None:
        beam, groups = settings.group(BeamSettings), settings.group(BeamGroupSettings)
        self.lm, self.loop, self.beam, self.pipeline = lm, loop, beam, pipeline
        self.masks = None  # no constraint (beam search refuses one with groups): the driver's ending reads it
        self.forced = list(loop.forced)
        self.groups = groups.num_beam_groups
        self.size = beam.num_beams // groups.num_beam_groups
        self.penalty = groups.diversity_penalty
        keep = max(2, 1 + len(lm.eos_token_ids))
        prompt_len = len(loop.prompt_ids) + len(self.forced)  # the search starts after the forced prefix
        self.shape = SearchShape(
            num_beams=beam.num_beams, keep=keep * beam.num_beams, prompt_len=prompt_len,
            max_length=len(loop.prompt_ids) + loop.max_steps, length_penalty=beam.length_penalty,
            early_stopping=parse_early_stopping(beam.early_stopping))
        self.group_shape = dataclasses.replace(self.shape, num_beams=self.size, keep=keep * self.size)
        # 4.46's step ends a beam at EOS only; the length limit is its finalize's (``admit_running``).
        self._expand_shape = dataclasses.replace(self.group_shape, max_length=sys.maxsize)
        self.text = TokenTextCache(lm.tokenizer)
        self.eos = torch.tensor(lm.eos_token_ids, dtype=torch.long, device=lm.device)
        self.pad = _pad_id(lm)
        self.prompt = torch.tensor([loop.prompt_ids + self.forced], dtype=torch.long, device=lm.device)
        one, empty = initial_state(self.prompt[0], self.group_shape, self.pad)
        n = beam.num_beams
        # As 4.46: num_beams copies of the prompt; each group's first beam scores 0 and the others -1e9, so a
        # group's first step expands one beam.
        scores = torch.full((n,), MASKED, device=lm.device)
        scores[:: self.size] = 0.0
        self.running = Hypotheses(one.sequences.expand(n, -1).clone(), scores, scores.clone(),
                                  torch.zeros(n, dtype=torch.long, device=lm.device),
                                  torch.zeros(n, dtype=torch.bool, device=lm.device))
        self.finished = [empty.take(torch.arange(self.size, device=lm.device)) for _ in range(self.groups)]
        self.done = [False] * self.groups
        self.cur_len = prompt_len

    def step(self, _index: int, _forced: int | None) -> Picked:
        loop, running, cur_len, size = self.loop, self.running, self.cur_len, self.size
        first = cur_len == self.shape.prompt_len
        cache = loop.cache
        logits = loop.logits  # the prefill's [1, vocab], for a first step that reads nothing
        if not first or loop.deferred:
            fed = running.sequences[:, cur_len - 1 : cur_len] if not first else self.prompt[:, -1:]
            with loop.watching():
                logits = self.lm.model(input_ids=fed, cache=cache, use_cache=True).logits[:, -1, :]  # [rows, vocab]
        assert logits is not None  # the prefill's, or this step's
        n = self.beam.num_beams
        log_probs = torch.log_softmax(logits.to(torch.float32), dim=-1).expand(n, -1)  # [n, vocab]
        vocab = log_probs.shape[-1]
        ids = running.sequences[:, :cur_len]
        last = cur_len + 1 >= self.shape.max_length
        chosen = torch.zeros(n, dtype=torch.long, device=log_probs.device)  # 4.46's current_tokens
        parents = torch.zeros(n, dtype=torch.long, device=log_probs.device)
        sequences = running.sequences.clone()
        scores = torch.zeros(n, device=log_probs.device)
        decisions: list[GroupDecision] = []
        for g in range(self.groups):
            rows = slice(g * size, (g + 1) * size)
            if self.done[g]:  # 4.46 pads a done group: its first beam, the pad token, score 0
                chosen[rows], parents[rows] = self.pad, g * size
                sequences[rows] = running.sequences[g * size]
                sequences[rows, cur_len] = self.pad
                continue
            group_lp = log_probs[rows]  # [size, vocab]
            penalties = diversity_penalties(chosen[: g * size], vocab, self.penalty) \
                if g and self.penalty > 0.0 else None
            if penalties is not None:
                group_lp = group_lp - penalties
            group_lp = run_pipeline(self.pipeline, ids[rows], group_lp)
            group_running = running.take(torch.arange(g * size, (g + 1) * size, device=log_probs.device))
            exp = expand_beams(group_lp, group_running, cur_len, self._expand_shape, self.eos)
            extended = extend_sequences(group_running, exp, cur_len)  # [K, max_length]
            finished, entered = merge_finished(self.finished[g], exp, extended, cur_len, self.group_shape, True)
            survivors = choose_running(exp, size)
            sequences[rows], scores[rows] = extended[survivors], exp.scores[survivors]
            parents[rows], chosen[rows] = g * size + exp.parents[survivors], exp.tokens[survivors]
            self.done[g] = group_done(finished, exp.scores[:1], cur_len + 1, self.group_shape)
            if last and not self.done[g]:
                now = Hypotheses(sequences[rows], scores[rows], scores[rows], running.lengths[rows],
                                 running.done[rows])
                finished, admitted = admit_running(finished, now, cur_len, self.group_shape)
                entered[survivors[admitted]] = True
            self.finished[g] = finished
            decisions.append(GroupDecision(g, exp, survivors, entered, penalties))
        ended = last or all(self.done)
        if not last:
            lengths = torch.full_like(parents, cur_len + 1 - self.shape.prompt_len)
            self.running = Hypotheses(sequences, scores, scores, lengths, torch.zeros_like(parents, dtype=torch.bool))
            if not ended:
                cache.reorder_cache(parents if not first else torch.zeros_like(parents))
        self.cur_len = cur_len = cur_len + 1
        best_row = int(parents[0]) if not last else int(decisions[0].expansion.parents[0]) if decisions else 0
        if first:
            best_row = 0

        def events(_texts: list[str], step_ms: float) -> list[Event]:
            gen_len = cur_len - self.shape.prompt_len
            candidates: list[DiverseBeamCandidate] = []
            for decision in decisions:
                candidates.extend(self._candidates(decision, gen_len, continues=not last))
            continuing = () if last else tuple(range(n))
            return [DiverseBeamStep(
                step=gen_len - 1,
                parents=tuple(parents.tolist()[i] for i in continuing),
                token_ids=tuple(chosen.tolist()[i] for i in continuing),
                scores=tuple(scores.tolist()[i] for i in continuing),
                candidates=tuple(candidates),
                step_ms=step_ms,
                kv_cache_bytes=kv_cache_bytes(cache),
            )]

        # The lens (an observer) records the row group 0's best beam grew from (the step event's first beam).
        return Picked([], events, logits=logits[best_row : best_row + 1], seen=((best_row, -1),), rows=True,
                      ended=ended)

    def _candidates(self, decision: GroupDecision, gen_len: int, continues: bool) -> list[DiverseBeamCandidate]:
        exp, g = decision.expansion, decision.group
        survived = torch.zeros_like(decision.entered)
        if continues:
            survived[decision.survivors] = True
        paid = decision.penalties[exp.tokens].tolist() if decision.penalties is not None else [0.0] * len(exp.tokens)
        normalised = (exp.scores / gen_len**self.shape.length_penalty).tolist()
        rows = zip(exp.parents.tolist(), exp.tokens.tolist(), exp.token_logprobs.tolist(), exp.scores.tolist(),
                   survived.tolist(), decision.entered.tolist(), normalised, paid, strict=True)
        return [DiverseBeamCandidate(beam=g * self.size + parent, token_id=token, text=self.text(token),
                              token_logprob=logprob, score=score, survived=alive, finished=fin,
                              finished_score=norm if fin else None, group=g, diversity_penalty=penalty)
                for parent, token, logprob, score, alive, fin, norm, penalty in rows]

    def best(self, stopped: bool) -> tuple[BeamSequence, ...]:
        """The best hypotheses across the groups (4.46's ``finalize``); a stopped run's groups that are not done
        first take in their running beams as if they ended there. Stopped before the first step: none."""
        if self.cur_len == self.shape.prompt_len:
            return ()
        pools = []
        for g, finished in enumerate(self.finished):
            if stopped and not self.done[g]:
                rows = torch.arange(g * self.size, (g + 1) * self.size, device=finished.scores.device)
                finished, _ = admit_running(finished, self.running.take(rows), self.cur_len - 1, self.group_shape)
            pools.append(finished.take(finished.done.nonzero().flatten()))
        pool = Hypotheses(*(torch.cat([getattr(p, f.name) for p in pools])
                            for f in dataclasses.fields(Hypotheses)))
        # 4.46 sorts ascending and pops from the end: among equal scores the later group's comes first.
        order = sorted(range(pool.scores.shape[0]), key=lambda i: float(pool.scores[i]))[::-1]
        hyps = pool.take(torch.tensor(order, dtype=torch.long, device=pool.scores.device))
        return to_sequences(hyps, self.beam.num_return_sequences, self.shape.prompt_len, self.forced,
                            self.lm.tokenizer)
