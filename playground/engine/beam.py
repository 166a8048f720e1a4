"""Beam search, step by step, with every beam expanded in one batched forward pass.

The algorithm is transformers' own ``_beam_search`` (generation/utils.py, 5.x) for one prompt, so sequences and
``sequences_scores`` match ``model.generate(num_beams=...)`` exactly:

1. log-softmax of the raw logits, then the processors (repetition penalty, no-repeat-n-gram) on the log-probs;
2. add each beam's running score and take the top ``K = max(2, 1 + n_eos) * num_beams`` continuations over
   ``beams x vocab`` (K > num_beams so that enough beams survive when some of them pick EOS);
3. a continuation that hits EOS or the length limit is a *finished hypothesis* candidate if it ranks among the
   first ``num_beams``; its score is ``sum_logprobs / generated_length ** length_penalty`` and it enters the
   ``num_beams`` best finished hypotheses if it beats the worst of them;
4. the best ``num_beams`` continuations that did not finish are the next step's running beams; the KV cache rows
   are reordered to follow their parents;
5. stop when no continuation is possible (length limit), when ``early_stopping`` is ``"true"`` and ``num_beams``
   hypotheses are finished, or when the best running beam can no longer beat the worst finished hypothesis
   (``"false"``: judged at the current length; ``"never"``: at the longest possible length when
   ``length_penalty > 0``).

The prompt is prefilled once (batch 1); the first step's selection reorders the cache from 1 row to
``num_beams`` rows, which is the same as transformers' prefill of ``num_beams`` identical rows. The search is one
step supplied to the decode loop (``Search.step``: rows = beams), so Stop, timing, the budget and the observers
(the lens of the best beam's row, the cache's measurements) are the loop's.

A constraint (``--regex``, ``--json-schema``, ...) is one matcher per running beam (``engine.constraint.BeamMasks``):
each beam's row of processed log-probs is masked by its own matcher before the top K (transformers'
``prefix_allowed_tokens_fn`` with a matcher per hypothesis), forbidden continuations are dropped from the K
(``allowed_only``), an ended one never runs on (``live``: the beams are fewer instead), and the matchers follow the
survivors' parents. An end token is allowed only where the beam's grammar accepts, so a finished hypothesis is a
complete one; each ``BeamStep.grammar`` records what the mask did to every beam it expanded.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from playground.config import BeamSettings, ConfigError, KVSettings, RunSettings
from playground.config.beam_forced import ForcedWordsSettings
from playground.engine.constraint import BeamMasks, apart
from playground.engine.decode import DecodeLoop, Picked
from playground.engine.kv.decode import new_cache
from playground.engine.kv_cache import kv_cache_bytes
from playground.engine.processors import NamedTransform, build_pipeline, run_pipeline
from playground.engine.prompt import check_fits_context, encode_prompt
from playground.engine.run_context import RunContext, StopCheck
from playground.engine.run_events import RunRecorder
from playground.engine.token_text import TokenTextCache
from playground.events import BeamCandidate, BeamSequence, BeamStep, Event, StopReason
from playground.events.grammar import GrammarStep
from playground.models.loaded import LoadedModel

MASKED = -1.0e9  # transformers' "never pick this" score


@dataclass
class Hypotheses:
    """A fixed-size set of beams: the running ones, or the ``num_beams`` best finished ones.

    Rows are sorted best first (every update goes through ``torch.topk``).
    """

    sequences: torch.Tensor  # [rows, max_length] prompt + generated ids, padded
    scores: torch.Tensor  # [rows] running: cumulative log-prob; finished: length-normalised score
    sum_logprobs: torch.Tensor  # [rows] cumulative log-prob
    lengths: torch.Tensor  # [rows] generated tokens
    done: torch.Tensor  # [rows] bool: a real finished hypothesis (finished set only)

    def take(self, rows: torch.Tensor) -> Hypotheses:
        return Hypotheses(self.sequences[rows], self.scores[rows], self.sum_logprobs[rows], self.lengths[rows],
                          self.done[rows])


@dataclass(frozen=True)
class Expansion:
    """The top K continuations of one step, best first."""

    scores: torch.Tensor  # [K] cumulative log-prob (running score + token log-prob)
    token_logprobs: torch.Tensor  # [K] processed log-prob of the token given its beam
    parents: torch.Tensor  # [K] row of the parent beam
    tokens: torch.Tensor  # [K] token ids
    hits_stop: torch.Tensor  # [K] bool: ends with EOS or reaches the length limit


@dataclass(frozen=True)
class SearchShape:
    num_beams: int
    keep: int  # K continuations examined per step
    prompt_len: int
    max_length: int  # prompt + generated tokens at most
    length_penalty: float
    early_stopping: bool | str  # True | False | "never", as transformers spells it


def parse_early_stopping(value: str) -> bool | str:
    options: dict[str, bool | str] = {"true": True, "false": False, "never": "never"}
    return options[value]


def expand_beams(
    log_probs: torch.Tensor, running: Hypotheses, cur_len: int, shape: SearchShape, eos: torch.Tensor
) -> Expansion:
    """Top K continuations over all beams (``_get_top_k_continuations`` plus the stopping criteria)."""
    vocab = log_probs.shape[-1]  # log_probs: [rows, vocab], processed
    accumulated = (log_probs + running.scores[:, None]).reshape(-1)  # [rows * vocab]
    scores, flat = torch.topk(accumulated, k=min(shape.keep, accumulated.numel()))  # [K]
    parents = flat // vocab
    tokens = flat % vocab
    hits = torch.isin(tokens, eos) | (cur_len + 1 >= shape.max_length)
    return Expansion(scores, log_probs.reshape(-1)[flat], parents, tokens, hits)


def extend_sequences(running: Hypotheses, exp: Expansion, cur_len: int) -> torch.Tensor:
    sequences = running.sequences[exp.parents].clone()  # [K, max_length]
    sequences[:, cur_len] = exp.tokens
    return sequences


def choose_running(exp: Expansion, num_beams: int) -> torch.Tensor:
    """Rows of the expansion that continue: the best ``num_beams`` that did not finish."""
    live = exp.scores + exp.hits_stop.to(torch.float32) * MASKED  # [K]
    return torch.topk(live, k=min(num_beams, live.shape[0])).indices  # [num_beams] (fewer: fewer continuations)


def allowed_only(exp: Expansion) -> Expansion:
    """The continuations the constraint allows (a finite score): with few tokens allowed, the top K over all beams
    holds forbidden ones at ``-inf``, which are no continuations (they are not recorded, and none survives)."""
    keep = torch.isfinite(exp.scores)
    if bool(keep.all()):
        return exp
    return dataclasses.replace(exp, scores=exp.scores[keep], token_logprobs=exp.token_logprobs[keep],
                               parents=exp.parents[keep], tokens=exp.tokens[keep], hits_stop=exp.hits_stop[keep])


def live(exp: Expansion, survivors: torch.Tensor) -> torch.Tensor:
    """The survivors that go on: not one that ended (with few continuations allowed, transformers' search keeps an
    ended one running at a score of -1e9 to fill the beams; under a constraint the beams are fewer instead)."""
    return survivors[~exp.hits_stop[survivors]]


def merge_finished(
    finished: Hypotheses,
    exp: Expansion,
    sequences: torch.Tensor,
    cur_len: int,
    shape: SearchShape,
    improvable: bool,
) -> tuple[Hypotheses, torch.Tensor]:
    """``_update_finished_beams``: keep the ``num_beams`` best finished hypotheses.

    Returns the new set and, for each expansion row, whether it entered the set this step.
    """
    keep = exp.scores.shape[0]
    gen_len = cur_len + 1 - shape.prompt_len
    normalised = exp.scores / (gen_len**shape.length_penalty)  # [K]
    # Only the first num_beams rows may finish (the rest are spares that keep enough beams running); nothing
    # enters once early stopping is satisfied or (early_stopping=True) the set is full.
    full = bool(finished.done.all()) and shape.early_stopping is True
    in_top = torch.arange(keep, device=exp.scores.device) < shape.num_beams
    eligible = exp.hits_stop & in_top  # [K]
    if full or not improvable:
        eligible = torch.zeros_like(eligible)
    candidate_scores = torch.where(eligible, normalised, torch.full_like(normalised, MASKED))
    merged = Hypotheses(
        sequences=torch.cat((finished.sequences, sequences)),
        scores=torch.cat((finished.scores, candidate_scores)),
        sum_logprobs=torch.cat((finished.sum_logprobs, exp.scores)),
        lengths=torch.cat((finished.lengths, torch.full_like(exp.parents, gen_len))),
        done=torch.cat((finished.done, eligible)),
    )
    picked = torch.topk(merged.scores, k=shape.num_beams).indices  # [num_beams]
    entered = torch.zeros(keep, dtype=torch.bool, device=exp.scores.device)
    new_rows = picked[picked >= shape.num_beams] - shape.num_beams
    entered[new_rows] = eligible[new_rows]
    return merged.take(picked), entered


def still_improvable(running: Hypotheses, finished: Hypotheses, cur_len: int, shape: SearchShape) -> bool:
    """``_check_early_stop_heuristic``: can the best running beam still beat the worst finished hypothesis?"""
    if shape.early_stopping == "never" and shape.length_penalty > 0.0:
        best_length = shape.max_length - shape.prompt_len
    else:
        best_length = cur_len - shape.prompt_len
    best_possible = running.scores[:1] / (best_length**shape.length_penalty)  # [1]
    worst_finished = torch.where(finished.done, finished.scores.min(), torch.full_like(finished.scores, MASKED))
    return bool((best_possible > worst_finished).any())


def initial_state(prompt: torch.Tensor, shape: SearchShape, pad: int) -> tuple[Hypotheses, Hypotheses]:
    """One running beam (the prompt) and ``num_beams`` empty finished slots."""
    device = prompt.device
    sequences = torch.full((1, shape.max_length), pad, dtype=torch.long, device=device)
    sequences[0, : shape.prompt_len] = prompt
    zeros = torch.zeros(1, device=device)
    running = Hypotheses(sequences, zeros, zeros, torch.zeros(1, dtype=torch.long, device=device),
                         torch.zeros(1, dtype=torch.bool, device=device))
    n = shape.num_beams
    finished = Hypotheses(
        sequences=sequences.expand(n, -1).clone(),
        scores=torch.full((n,), MASKED, device=device),
        sum_logprobs=torch.full((n,), MASKED, device=device),
        lengths=torch.zeros(n, dtype=torch.long, device=device),
        done=torch.zeros(n, dtype=torch.bool, device=device),
    )
    return running, finished


def process_log_probs(logits: torch.Tensor, ids: torch.Tensor, pipeline: tuple[NamedTransform, ...]) -> torch.Tensor:
    """Raw logits [rows, vocab] -> processed log-probs, in float32 as transformers computes them."""
    log_probs = torch.log_softmax(logits.to(torch.float32), dim=-1)
    return run_pipeline(pipeline, ids, log_probs)


def step_candidates(exp: Expansion, survivors: torch.Tensor, entered: torch.Tensor, normalised: list[float],
                    text: TokenTextCache) -> tuple[BeamCandidate, ...]:
    survived = torch.zeros_like(entered)
    survived[survivors] = True
    rows = zip(exp.parents.tolist(), exp.tokens.tolist(), exp.token_logprobs.tolist(), exp.scores.tolist(),
               survived.tolist(), entered.tolist(), normalised, strict=True)
    return tuple(
        BeamCandidate(beam=parent, token_id=token, text=text(token), token_logprob=logprob, score=score,
                      survived=alive, finished=fin, finished_score=norm if fin else None)
        for parent, token, logprob, score, alive, fin, norm in rows
    )


def best_so_far(running: Hypotheses, finished: Hypotheses, cur_len: int, shape: SearchShape) -> Hypotheses:
    """For a stopped run: finished hypotheses plus the running beams scored as if they ended now."""
    gen_len = cur_len - shape.prompt_len
    if gen_len <= 0:
        return finished.take(finished.done.nonzero().flatten())
    as_finished = Hypotheses(running.sequences, running.scores / (gen_len**shape.length_penalty),
                             running.sum_logprobs, torch.full_like(running.lengths, gen_len),
                             torch.ones_like(running.done))
    real = finished.done.nonzero().flatten()
    pool = Hypotheses(
        torch.cat((finished.sequences[real], as_finished.sequences)),
        torch.cat((finished.scores[real], as_finished.scores)),
        torch.cat((finished.sum_logprobs[real], as_finished.sum_logprobs)),
        torch.cat((finished.lengths[real], as_finished.lengths)),
        torch.cat((finished.done[real], as_finished.done)),
    )
    return pool.take(torch.argsort(pool.scores, descending=True, stable=True))


def to_sequences(hyps: Hypotheses, count: int, prompt_len: int, forced: list[int], tokenizer: Any,
                 ) -> tuple[BeamSequence, ...]:
    """The best ``count`` hypotheses as plain values: generated ids (forced prefix first), text, scores."""
    result = []
    for row in range(min(count, hyps.scores.shape[0])):
        length = int(hyps.lengths[row])
        ids = (*forced, *hyps.sequences[row, prompt_len : prompt_len + length].tolist())
        result.append(BeamSequence(token_ids=ids, text=tokenizer.decode(list(ids), skip_special_tokens=True),
                                   score=float(hyps.scores[row]), sum_logprobs=float(hyps.sum_logprobs[row])))
    return tuple(result)


def run_beam_search(lm: LoadedModel, settings: RunSettings, context: RunContext | StopCheck | None = None,
                    search: Callable[..., Any] | None = None) -> Iterator[Event]:
    """Beam search as a generator of events: RunStarted, PrefillDone, BeamStep..., RunFinished.

    Stop (the context's) is polled before each step; a stopped run still reports its best hypotheses so far
    (finished ones, and running beams scored as if they ended there). Forced tokens (branching) are a fixed prefix
    that every beam starts from: they go through the prefill with the prompt, count towards ``max_new_tokens``,
    start every returned sequence, and are not part of the scores. Settings and prompt are checked before the
    generator is returned (``ConfigError``). ``search(lm, loop, settings, pipeline)``: another search over the beams
    for this driver (diverse beam search's, ``playground.engine.beam_groups``); plain beam search by default.
    """
    settings.validate()
    if settings.group(ForcedWordsSettings).active():  # run_strategy hands these to playground.engine.beam_forced
        raise ConfigError("--force-words is constrained beam search: run it through run_strategy")
    if settings.stop_strings:
        raise ConfigError("beam search does not take stop strings (a stop string would end some beams but not "
                          "others mid-search): clear them, or use greedy or sampling")
    prompt_ids, prompt_text = encode_prompt(lm, settings)
    forced = list(settings.forced_token_ids)
    check_fits_context(lm, len(prompt_ids) + len(forced), settings)
    if len(forced) >= settings.max_new_tokens:
        raise ConfigError(f"{len(forced)} forced tokens leave no room for beam search within max_new_tokens="
                          f"{settings.max_new_tokens}: raise max_new_tokens")
    kv = settings.group(KVSettings)
    if kv.no_cache:
        raise ConfigError("beam search keeps a cache for every beam: --no-cache is for the kv-cache strategy")
    record = RunRecorder(lm, settings, context, groups=(BeamSettings,))
    # Built here, so a sampler the search refuses (guidance, a logit bias on no token) fails before the first event.
    # A constraint is built apart: each beam gets its own matcher (``engine.constraint.BeamMasks``).
    plain, grammar = apart(settings, lm.tokenizer, lm.model.config.vocab_size, lm.eos_token_ids)
    pipeline = build_pipeline(plain, sampling=False, tokenizer=lm.tokenizer)
    loop = DecodeLoop(lm, settings, record, prompt_ids, prompt_text)
    masks = BeamMasks(grammar) if grammar is not None else None
    if search is None:
        found = Search(lm, loop, settings.group(BeamSettings), pipeline, masks)
    elif masks is not None:
        raise ConfigError("diverse beam search (--num-beam-groups) does not take a constraint yet (its groups have "
                          "no per-beam matcher): set --num-beam-groups 1, or drop the constraint")
    else:
        found = search(lm, loop, settings, pipeline)
    return _beam_search(lm, loop, found, kv)


class Search:
    """The search's state between steps, and its step for the decode loop (rows = the running beams)."""

    def __init__(self, lm: LoadedModel, loop: DecodeLoop, beam: BeamSettings,
                 pipeline: tuple[NamedTransform, ...], masks: BeamMasks | None = None) -> None:
        self.lm, self.loop, self.beam, self.pipeline = lm, loop, beam, pipeline
        self.forced = list(loop.forced)
        self.masks = masks  # a constraint's matcher per running beam (None: no constraint)
        if masks is not None:
            masks.prefix(self.forced)  # every beam starts after the forced prefix
        prompt_len = len(loop.prompt_ids) + len(self.forced)  # the search starts after the forced prefix
        self.shape = SearchShape(
            num_beams=beam.num_beams,
            keep=max(2, 1 + len(lm.eos_token_ids)) * beam.num_beams,
            prompt_len=prompt_len,
            max_length=len(loop.prompt_ids) + loop.max_steps,  # min(prompt + max_new_tokens, the context)
            length_penalty=beam.length_penalty,
            early_stopping=parse_early_stopping(beam.early_stopping),
        )
        self.text = TokenTextCache(lm.tokenizer)
        self.eos = torch.tensor(lm.eos_token_ids, dtype=torch.long, device=lm.device)
        self.prompt = torch.tensor([loop.prompt_ids + self.forced], dtype=torch.long, device=lm.device)
        self.running, self.finished = initial_state(self.prompt[0], self.shape, _pad_id(lm))
        self.cur_len, self.improvable = prompt_len, True

    def step(self, _index: int, _forced: int | None) -> Picked:
        shape, loop, running, cur_len = self.shape, self.loop, self.running, self.cur_len
        cache = loop.cache
        logits = loop.logits  # the prefill's, for a first step that reads nothing
        if cur_len > shape.prompt_len or loop.deferred:
            fed = running.sequences[:, cur_len - 1 : cur_len] if cur_len > shape.prompt_len else self.prompt[:, -1:]
            with loop.watching():
                logits = self.lm.model(input_ids=fed, cache=cache, use_cache=True).logits[:, -1, :]  # [rows, vocab]
        assert logits is not None  # the prefill's, or this step's
        log_probs = process_log_probs(logits, running.sequences[:, :cur_len], self.pipeline)  # [rows, vocab]
        masked: tuple[GrammarStep, ...] = ()
        if self.masks is not None:  # each beam's row by its own matcher, before the top K
            log_probs, masked = self.masks.apply(logits, log_probs)
        exp = expand_beams(log_probs, running, cur_len, shape, self.eos)
        if self.masks is not None:
            exp = allowed_only(exp)
        sequences = extend_sequences(running, exp, cur_len)  # [K, max_length]
        self.finished, entered = merge_finished(self.finished, exp, sequences, cur_len, shape, self.improvable)
        can_continue = not bool(exp.hits_stop.all())
        survivors = choose_running(exp, shape.num_beams) if can_continue else exp.parents[:0]
        if self.masks is not None:  # a beam the constraint left no token drops out
            survivors = live(exp, survivors)
            can_continue = can_continue and len(survivors) > 0
            if can_continue:
                self.masks.follow(exp.parents[survivors].tolist(), exp.tokens[survivors].tolist())
        if can_continue:
            self.running = running = Hypotheses(
                sequences[survivors], exp.scores[survivors], exp.scores[survivors],
                torch.full_like(survivors, cur_len + 1 - shape.prompt_len),
                torch.zeros_like(survivors, dtype=torch.bool))
            cache.reorder_cache(exp.parents[survivors])
        self.cur_len = cur_len = cur_len + 1
        self.improvable = self.improvable and can_continue and still_improvable(running, self.finished, cur_len, shape)
        all_done = bool(self.finished.done.all()) and shape.early_stopping is True
        best_row = int(exp.parents[survivors][0]) if len(survivors) else int(exp.parents[0]) if len(exp.parents) else 0

        def events(_texts: list[str], step_ms: float) -> list[Event]:
            normalised = (exp.scores / ((cur_len - shape.prompt_len) ** shape.length_penalty)).tolist()
            return [BeamStep(
                step=cur_len - 1 - shape.prompt_len,
                parents=tuple(exp.parents[survivors].tolist()),
                token_ids=tuple(exp.tokens[survivors].tolist()),
                scores=tuple(exp.scores[survivors].tolist()),
                candidates=step_candidates(exp, survivors, entered, normalised, self.text),
                step_ms=step_ms,
                kv_cache_bytes=kv_cache_bytes(cache),
                grammar=masked,
            )]

        # The lens (an observer) records the row the best beam grew from.
        return Picked([], events, logits=logits[best_row : best_row + 1], seen=((best_row, -1),), rows=True,
                      ended=not (self.improvable and not all_done and can_continue))

    def best(self, stopped: bool) -> tuple[BeamSequence, ...]:
        """The sequences to return; stopped before the first step (during the prefill): none, no made-up score."""
        if self.cur_len == self.shape.prompt_len:
            return ()
        hyps = best_so_far(self.running, self.finished, self.cur_len, self.shape) if stopped else self.finished
        if self.masks is not None and not stopped:  # beams the constraint ended early can leave slots empty
            hyps = hyps.take(hyps.done.nonzero().flatten())
        return to_sequences(hyps, self.beam.num_return_sequences, self.shape.prompt_len, self.forced,
                            self.lm.tokenizer)


def _beam_search(lm: LoadedModel, loop: DecodeLoop, search: Any, kv: KVSettings) -> Iterator[Event]:
    loop.rows = search.beam.num_beams  # the cache holds one sequence per beam (the KV measurements count them)
    loop.taken = len(search.forced)  # the forced prefix is read with the prompt and counts towards the budget
    yield loop.started()
    with torch.inference_mode():
        # The cache the settings ask for (--paged, --kv-dtype: beams share the prompt's blocks, copy on write).
        cache = new_cache(lm, kv) if kv.paged or kv.kv_dtype != "model" else None
        if (yield from loop.prefill(cache=cache, ids=search.prompt)):
            yield from loop.steps(search.step)
    stopped = loop.stop_reason == "stopped"
    sequences = search.best(stopped)
    top = sequences[0] if sequences else None
    loop.generated = list(top.token_ids) if top else []
    loop.stop_reason = _stop_reason(top, lm.eos_token_ids, stopped, loop.budget_reason)
    if search.masks is not None and not stopped:
        loop.stop_reason, loop.stop_note = search.masks.ending(top, loop.stop_reason)
    yield loop.finished(steps=search.cur_len - search.shape.prompt_len, sequences=sequences)


def _stop_reason(best: BeamSequence | None, eos_ids: tuple[int, ...], stopped: bool, budget: StopReason
                 ) -> StopReason:
    if stopped:
        return "stopped"
    if best is not None and best.token_ids and best.token_ids[-1] in eos_ids:
        return "eos"
    return budget  # "max_new_tokens", or "context_full" when the context ends first


def _pad_id(lm: LoadedModel) -> int:
    """The fill value transformers uses for unfinished positions: pad id, else the first EOS id."""
    pad = getattr(lm.model.generation_config, "pad_token_id", None)
    if pad is None:
        pad = lm.tokenizer.pad_token_id
    if pad is None:
        pad = lm.eos_token_ids[0] if lm.eos_token_ids else 0
    return int(pad)
