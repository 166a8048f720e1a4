"""Constrained beam search (forced words), step by step: transformers 4.46's ``_constrained_beam_search`` with its
``ConstrainedBeamSearchScorer`` for one prompt, so the sequences equal ``generate(num_beams=N,
force_words_ids=...)`` token for token.

Each step, over ``beams x vocab`` (log-softmax, the processors, plus each beam's running score):

1. the top ``K = max(2, 1 + n_eos) * N`` continuations, best first (beam.py's ``expand_beams``);
2. walking them in order: an EOS among the first ``N`` becomes a finished hypothesis only if its beam has met every
   constraint ("a beam that is done must have met all constraints"); the first ``N`` that are not EOS are kept;
3. every beam that has not met all its constraints proposes one candidate per token that advances them (the next
   token of the one in progress, else the first token of each pending one), scored like any other;
4. the kept and the proposed candidates are sorted by ``bank * 100 + score`` (bank: progress through the
   constraints, ``constraints.bank``) and dealt round-robin over the banks, best bank first: the best of each bank,
   then the second of each, ...; the first ``N`` are the next beams (the cache follows their parents);
5. done when ``N`` hypotheses finished and none of the running beams can beat the worst (4.46's ``BeamHypotheses``,
   judged on the step's best top-K score), or at the length limit; then the running beams that met every constraint
   join the finished ones (and, if fewer than ``num_return_sequences`` did, the others: 4.46's fallback).

It runs in place of beam search's runner when ``--force-words`` is given (``run_forced_wrapper``, the settings
group's wrapper). The first step reads one row (the prompt), which equals 4.46's ``N`` identical rows with all but
the first at −1e9: their candidates are never among the top K, and the ones their constraints propose repeat the
first row's (4.46 drops repeated sequences). Stop, the budget, timing and the observers are the decode loop's, as
for beam.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from playground.config import BeamSettings, ConfigError, KVSettings, QuantSettings, RunSettings
from playground.config.beam_forced import ForcedWordsSettings, parse_force_word
from playground.engine.beam import (
    Expansion,
    Hypotheses,
    SearchShape,
    _pad_id,
    _stop_reason,
    expand_beams,
    initial_state,
    parse_early_stopping,
    process_log_probs,
)
from playground.engine.beam_forced.constraints import (
    Constraint,
    Progress,
    add,
    add_all,
    advance_banks,
    advance_tokens,
    bank,
    bank_unit,
    count_leaves,
    start,
)
from playground.engine.decode import DecodeLoop, Picked
from playground.engine.kv.decode import new_cache
from playground.engine.kv_cache import kv_cache_bytes
from playground.engine.processors import NamedTransform, build_pipeline
from playground.engine.prompt import check_fits_context, encode_prompt
from playground.engine.run_context import RunContext, StopCheck
from playground.engine.run_events import RunRecorder
from playground.engine.token_text import TokenTextCache
from playground.events import BeamCandidate, BeamSequence, BeamStep, Event
from playground.events.beam_forced import BankedCandidate, BeamBanks, ForcedWord, ForcedWordsDone, ForcedWordsStarted
from playground.models.loaded import LoadedModel

BANK_WEIGHT = 100  # 4.46 sorts by bank * 100 + score


def build_constraints(lm: LoadedModel, words: tuple[str, ...]) -> tuple[Constraint, ...]:
    """Each ``--force-words`` as token ids (as written, no special tokens), or a ``ConfigError`` saying why not."""
    eos = set(lm.eos_token_ids)
    constraints = []
    for word in words:
        alternatives = []
        for text in parse_force_word(word):
            ids = tuple(lm.tokenizer(text, add_special_tokens=False)["input_ids"])
            if not ids:
                raise ConfigError(f"--force-words {word!r}: {text!r} is no token of {lm.name}'s tokenizer")
            if eos & set(ids):
                raise ConfigError(f"--force-words {word!r}: {text!r} holds the end-of-sequence token; a sequence "
                                  "ends there, so it cannot be forced")
            alternatives.append(ids)
        constraint = Constraint.of(word, tuple(alternatives))
        if count_leaves(constraint.trie) != len(alternatives):
            raise ConfigError(f"--force-words {word!r}: one alternative's tokens start another's (or are the same); "
                              "transformers refuses such a set, since the shorter one would always be met first")
        constraints.append(constraint)
    return tuple(constraints)


class FinishedPool:
    """4.46's ``BeamHypotheses``: the ``N`` best finished hypotheses and when no running beam can beat them."""

    def __init__(self, shape: SearchShape) -> None:
        self.shape = shape
        self.beams: list[tuple[float, tuple[int, ...], float, int]] = []  # score, generated ids, sum, length
        self.worst = 1e9

    def add(self, ids: tuple[int, ...], sum_logprobs: float, length: int) -> bool:
        score = sum_logprobs / (length**self.shape.length_penalty)
        if len(self.beams) < self.shape.num_beams or score > self.worst:
            self.beams.append((score, ids, sum_logprobs, length))
            if len(self.beams) > self.shape.num_beams:
                ranked = sorted((s, i) for i, (s, *_rest) in enumerate(self.beams))
                del self.beams[ranked[0][1]]
                self.worst = ranked[1][0]
            else:
                self.worst = min(score, self.worst)
            return True
        return False

    def is_done(self, best_sum_logprobs: float, generated: int) -> bool:
        shape = self.shape
        if len(self.beams) < shape.num_beams:
            return False
        if shape.early_stopping is True:
            return True
        if shape.early_stopping == "never" and shape.length_penalty > 0.0:
            generated = shape.max_length - shape.prompt_len
        return self.worst >= best_sum_logprobs / generated**shape.length_penalty

    def best(self, count: int) -> list[tuple[float, tuple[int, ...], float, int]]:
        ranked = sorted(self.beams, key=lambda b: b[0])  # 4.46 pops from the end: equal scores, the later wins
        return [ranked.pop() for _ in range(min(count, len(ranked)))]


def deal_by_bank(banks: list[int], scores: torch.Tensor, count: int) -> list[int]:
    """4.46's order: sort by ``bank * 100 + score``, then the best of each bank (best bank first), the second of
    each, ...; the first ``count`` indices."""
    all_banks = torch.tensor(banks)
    indices = (all_banks * BANK_WEIGHT + scores).sort(descending=True).indices
    sorted_banks = all_banks[indices].tolist()
    increments, counter, current = [], -1, sorted_banks[0]
    for b in sorted_banks:
        counter, current = (counter + 1, current) if b == current else (0, b)
        increments.append(counter)
    rearranged = torch.tensor(np.argsort(increments, kind="mergesort"))
    return indices[rearranged][:count].tolist()


def run_forced_wrapper(_runner: Any, lm: LoadedModel, settings: RunSettings,
                       context: RunContext | StopCheck | None = None) -> Iterator[Event]:
    """``--force-words``'s wrapper of the beam strategy (``playground.config.beam_forced``): constrained beam
    search in place of plain beam search's runner."""
    if settings.group(QuantSettings).active():
        raise ConfigError("--force-words does not take --quant yet (each runs beam search its own way): drop one")
    return run_forced_beam_search(lm, settings, context)


def run_forced_beam_search(lm: LoadedModel, settings: RunSettings, context: RunContext | StopCheck | None = None
                           ) -> Iterator[Event]:
    """Constrained beam search as a generator of events: RunStarted, ForcedWordsStarted, PrefillDone,
    (BeamBanks, BeamStep)..., ForcedWordsDone, RunFinished. Checked before the generator is returned."""
    settings.validate()
    beam = settings.group(BeamSettings)
    if beam.num_beams < 2:
        raise ConfigError("--force-words needs at least 2 beams (transformers' constrained beam search refuses "
                          "num_beams=1): raise --num-beams")
    if settings.stop_strings:
        raise ConfigError("beam search does not take stop strings (a stop string would end some beams but not "
                          "others mid-search): clear them, or use greedy or sampling")
    if settings.group(KVSettings).no_cache:
        raise ConfigError("beam search keeps a cache for every beam: --no-cache is for the kv-cache strategy")
    constraints = build_constraints(lm, settings.group(ForcedWordsSettings).force_words)
    prompt_ids, prompt_text = encode_prompt(lm, settings)
    forced = list(settings.forced_token_ids)
    check_fits_context(lm, len(prompt_ids) + len(forced), settings)
    if len(forced) >= settings.max_new_tokens:
        raise ConfigError(f"{len(forced)} forced tokens leave no room for beam search within max_new_tokens="
                          f"{settings.max_new_tokens}: raise max_new_tokens")
    record = RunRecorder(lm, settings, context, groups=(BeamSettings, ForcedWordsSettings))
    pipeline = build_pipeline(settings, sampling=False, tokenizer=lm.tokenizer)
    loop = DecodeLoop(lm, settings, record, prompt_ids, prompt_text)
    search = ForcedSearch(lm, loop, beam, pipeline, constraints)
    return _forced_beam_search(lm, loop, search, settings.group(KVSettings))


class ForcedSearch:
    """The search's state between steps, and its step for the decode loop (rows = the running beams)."""

    def __init__(self, lm: LoadedModel, loop: DecodeLoop, beam: BeamSettings, pipeline: tuple[NamedTransform, ...],
                 constraints: tuple[Constraint, ...]) -> None:
        self.lm, self.loop, self.beam, self.pipeline, self.constraints = lm, loop, beam, pipeline, constraints
        self.forced = list(loop.forced)
        prompt_len = len(loop.prompt_ids) + len(self.forced)
        self.shape = SearchShape(
            num_beams=beam.num_beams, keep=max(2, 1 + len(lm.eos_token_ids)) * beam.num_beams,
            prompt_len=prompt_len, max_length=len(loop.prompt_ids) + loop.max_steps,
            length_penalty=beam.length_penalty, early_stopping=parse_early_stopping(beam.early_stopping))
        self.text = TokenTextCache(lm.tokenizer)
        self.eos = torch.tensor(lm.eos_token_ids, dtype=torch.long, device=lm.device)
        self.eos_ids = set(lm.eos_token_ids)
        self.prompt = torch.tensor([loop.prompt_ids + self.forced], dtype=torch.long, device=lm.device)
        self.running, _ = initial_state(self.prompt[0], self.shape, _pad_id(lm))
        self.progress: list[Progress] = [add_all(start(constraints), self.prompt[0].tolist(), constraints)]
        self.pool = FinishedPool(self.shape)
        self.cur_len, self.done = prompt_len, False
        self.finalized, self.filled_in = False, False

    def started(self) -> ForcedWordsStarted:
        words = tuple(ForcedWord(c.text, c.alternatives, tuple(tuple(self.text(t) for t in ids)
                                                                for ids in c.alternatives), c.disjunctive)
                      for c in self.constraints)
        return ForcedWordsStarted(words, bank_unit(self.constraints), self.progress[0].met)

    def step(self, _index: int, _forced: int | None) -> Picked:
        shape, loop, running, cur_len, constraints = self.shape, self.loop, self.running, self.cur_len, self.constraints
        logits = loop.logits
        if cur_len > shape.prompt_len or loop.deferred:
            fed = running.sequences[:, cur_len - 1 : cur_len] if cur_len > shape.prompt_len else self.prompt[:, -1:]
            with loop.watching():
                logits = self.lm.model(input_ids=fed, cache=loop.cache, use_cache=True).logits[:, -1, :]
        assert logits is not None
        log_probs = process_log_probs(logits, running.sequences[:, :cur_len], self.pipeline)  # [rows, vocab]
        accumulated = log_probs + running.scores[:, None]  # [rows, vocab], 4.46's scores_for_all_vocab
        exp = expand_beams(log_probs, running, cur_len, shape, self.eos)  # top K, best first
        parents, tokens = exp.parents.tolist(), exp.tokens.tolist()
        generated = cur_len + 1 - shape.prompt_len
        # 2. EOS among the first N: finished if its beam met every constraint; the first N others are kept.
        kept: list[int] = []
        entered = [False] * len(tokens)
        for rank, (parent, token) in enumerate(zip(parents, tokens, strict=True)):
            if token in self.eos_ids:
                if rank < shape.num_beams and self.progress[parent].completed:
                    ids = (*running.sequences[parent, shape.prompt_len : cur_len].tolist(), token)
                    entered[rank] = self.pool.add(ids, float(exp.scores[rank]), generated)
            else:
                kept.append(rank)
            if len(kept) == shape.num_beams:
                break
        # 3. What the constraints propose, from every beam that has not met them all.
        rows: list[tuple[int, int]] = [(parents[r], tokens[r]) for r in kept]
        after = [add(self.progress[p], t, constraints) for p, t in rows]
        banks = [bank(p, constraints) for p in after]
        seen = set(rows)
        proposed_rows: list[tuple[int, int]] = []
        for parent, progress in enumerate(self.progress):
            if progress.completed:
                continue
            ahead = advance_tokens(progress, constraints)
            for token, token_bank in zip(ahead, advance_banks(progress, ahead, constraints), strict=True):
                if (parent, token) in seen:
                    continue
                seen.add((parent, token))
                proposed_rows.append((parent, token))
                after.append(add(progress, token, constraints))
                banks.append(token_bank)
        all_rows = rows + proposed_rows
        scores = torch.stack([exp.scores[r] for r in kept] + [accumulated[p, t] for p, t in proposed_rows]).cpu()
        # 4. Dealt by bank (4.46 sorts only when something was proposed).
        chosen = deal_by_bank(banks, scores, shape.num_beams) if proposed_rows else list(range(len(rows)))
        self.done = self.pool.is_done(float(exp.scores[0]), generated)
        beam_parents = torch.tensor([all_rows[i][0] for i in chosen], device=self.lm.device)
        sequences = running.sequences[beam_parents].clone()
        sequences[:, cur_len] = torch.tensor([all_rows[i][1] for i in chosen], device=self.lm.device)
        new_scores = scores[chosen].to(self.lm.device)
        self.running = Hypotheses(sequences, new_scores, new_scores, torch.full_like(beam_parents, generated),
                                  torch.zeros_like(beam_parents, dtype=torch.bool))
        before, self.progress = self.progress, [after[i] for i in chosen]
        loop.cache.reorder_cache(beam_parents)
        self.cur_len = cur_len + 1
        # At the length limit the running beams join the finished ones (4.46's ``finalize``), shown as finished.
        final = self.finalize() if not self.done and self.cur_len >= shape.max_length else set()
        best_row = all_rows[chosen[0]][0]
        proposed_logprobs = [float(log_probs[p, t]) for p, t in proposed_rows]
        record = StepRecord(exp, kept, entered, all_rows, after, banks, chosen, scores.tolist(), proposed_logprobs,
                            before, generated, {chosen[b] for b in final})

        def events(_texts: list[str], step_ms: float) -> list[Event]:
            return self.step_events(record, step_ms)

        return Picked([], events, logits=logits[best_row : best_row + 1], seen=((best_row, -1),), rows=True,
                      ended=self.done)

    def step_events(self, rec: StepRecord, step_ms: float) -> list[Event]:
        """The step's BeamBanks and BeamStep: the top K first, then what the constraints proposed beyond them."""
        exp, constraints, penalty = rec.exp, self.constraints, self.shape.length_penalty
        parents, tokens = exp.parents.tolist(), exp.tokens.tolist()
        rows = list(zip(parents, tokens, exp.scores.tolist(), exp.token_logprobs.tolist(), strict=True))
        where = {(p, t): k for k, (p, t, _s, _l) in enumerate(rows)}  # a candidate's place in the events
        info: dict[int, BankedCandidate] = {}
        for i, (parent, token) in enumerate(rec.rows):
            place = where.get((parent, token))
            if place is None:  # proposed beyond the top K
                place = where[(parent, token)] = len(rows)
                rows.append((parent, token, rec.scores[i], rec.proposed_logprobs[i - len(rec.kept)]))
            info[place] = _banked(rec.after[i], rec.banks[i], proposed=i >= len(rec.kept), in_sort=True)
        survived = {where[rec.rows[i]] for i in rec.chosen}
        banked = []
        for place, (parent, token, _s, _l) in enumerate(rows):
            if place not in info:  # not sorted: its own progress
                progress = add(rec.before[parent], token, constraints)
                info[place] = _banked(progress, bank(progress, constraints), proposed=False, in_sort=False)
            banked.append(info[place])
        entered = rec.entered + [False] * (len(rows) - len(rec.entered))
        for i in rec.final:
            entered[where[rec.rows[i]]] = True
        candidates = tuple(
            BeamCandidate(beam=p, token_id=t, text=self.text(t), token_logprob=lp, score=s, survived=k in survived,
                          finished=entered[k], finished_score=s / rec.generated**penalty if entered[k] else None)
            for k, (p, t, s, lp) in enumerate(rows))
        survivors = [rec.rows[i] for i in rec.chosen]
        step = rec.generated - 1
        return [
            BeamBanks(step=step, candidates=tuple(banked), survivor_banks=tuple(rec.banks[i] for i in rec.chosen)),
            BeamStep(step=step, parents=tuple(p for p, _ in survivors), token_ids=tuple(t for _, t in survivors),
                     scores=tuple(rec.scores[i] for i in rec.chosen), candidates=candidates, step_ms=step_ms,
                     kv_cache_bytes=kv_cache_bytes(self.loop.cache)),
        ]

    def finalize(self) -> set[int]:
        """4.46's ``finalize``: the running beams that met every constraint join the finished hypotheses (and the
        others too, when fewer than ``num_return_sequences`` did). The beams (by index) that entered."""
        self.finalized = True
        shape, count = self.shape, self.beam.num_return_sequences
        generated = self.cur_len - shape.prompt_len
        met = [b for b, p in enumerate(self.progress) if p.completed]
        scores = self.running.scores.tolist()
        ids = [tuple(self.running.sequences[b, shape.prompt_len : self.cur_len].tolist()) for b in range(len(scores))]
        order = met + ([b for b in range(len(scores)) if b not in met] if len(met) < count else [])
        self.filled_in = len(met) < count
        return {b for b in order if self.pool.add(ids[b], scores[b], generated)}

    def best(self, stopped: bool) -> tuple[tuple[BeamSequence, ...], ForcedWordsDone | None]:
        """The returned sequences, best first (none when stopped before the first step), and what they met; a
        stopped run returns what ``finalize`` makes of its running beams then."""
        if self.cur_len == self.shape.prompt_len:
            return (), None
        if stopped and not self.finalized and not self.done:
            self.finalize()
        sequences, met_by = [], []
        for score, ids, sum_logprobs, _length in self.pool.best(self.beam.num_return_sequences):
            full = (*self.forced, *ids)
            text = self.lm.tokenizer.decode(list(full), skip_special_tokens=True)
            sequences.append(BeamSequence(token_ids=full, text=text, score=score, sum_logprobs=sum_logprobs))
            whole = self.prompt[0].tolist() + list(ids)
            met_by.append(tuple(sorted(add_all(start(self.constraints), whole, self.constraints).met)))
        return tuple(sequences), ForcedWordsDone(tuple(met_by), self.filled_in)


@dataclass(frozen=True)
class StepRecord:
    """What one step decided, kept for its events (made only when the loop asks for them)."""

    exp: Expansion
    kept: list[int]  # ranks of the top-K continuations kept (the first N that are not EOS)
    entered: list[bool]  # per top-K rank: an EOS that entered the finished hypotheses
    rows: list[tuple[int, int]]  # (parent, token) of each sorted candidate: the kept ones, then the proposed
    after: list[Progress]  # each sorted candidate's progress
    banks: list[int]  # the bank each was sorted by
    chosen: list[int]  # indices into rows of the next beams, in their order
    scores: list[float]  # each sorted candidate's cumulative log-prob
    proposed_logprobs: list[float]  # each proposed candidate's token log-prob
    before: list[Progress]  # each parent beam's progress
    generated: int  # tokens generated after this step
    final: set[int]  # indices into rows of the beams that joined the finished hypotheses at the length limit


def _banked(progress: Progress, sorted_bank: int, *, proposed: bool, in_sort: bool) -> BankedCandidate:
    return BankedCandidate(bank=sorted_bank, met=progress.met, current=-1 if progress.current is None
                           else progress.current, matched=len(progress.done), proposed=proposed, sorted=in_sort)


def _forced_beam_search(lm: LoadedModel, loop: DecodeLoop, search: ForcedSearch, kv: KVSettings) -> Iterator[Event]:
    loop.rows = search.beam.num_beams
    loop.taken = len(search.forced)
    yield loop.started()
    yield search.started()
    with torch.inference_mode():
        cache = new_cache(lm, kv) if kv.paged or kv.kv_dtype != "model" else None
        if (yield from loop.prefill(cache=cache, ids=search.prompt)):
            yield from loop.steps(search.step)
    stopped = loop.stop_reason == "stopped"
    sequences, done = search.best(stopped)
    if done is not None:
        yield done
    top = sequences[0] if sequences else None
    loop.generated = list(top.token_ids) if top else []
    loop.stop_reason = _stop_reason(top, lm.eos_token_ids, stopped, loop.budget_reason)
    yield loop.finished(steps=search.cur_len - search.shape.prompt_len, sequences=sequences)
