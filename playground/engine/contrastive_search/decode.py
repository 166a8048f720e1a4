"""Contrastive search's loop, step for step as transformers 4.46's ``_contrastive_search`` runs it.

The prompt is read once with the final norm's output kept (the last hidden state of every prompt position: 4.46's
``hidden_states[-1]``, after the final norm). Each step then takes the penalised distribution's k likeliest tokens,
repeats the one cache k times and runs the k continuations in one batched pass; each candidate's last hidden state
is compared with every earlier position's (``ranking``), the best score wins, and the winner's row of that pass
is kept: its cache row, its hidden state (now part of the context) and its logits (the next step's). So a step
costs one pass of k rows, as in 4.46. The hidden states are read at the anatomy's final norm
(``playground.models.anatomy``), never from the model's attributes.

Each step yields a ``SearchStep`` and then an ordinary ``TokenStep`` (the model's distribution after the
penalties, the token taken).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from playground.config import RunSettings
from playground.config.contrastive_search import ContrastiveSearchSettings
from playground.engine.contrastive_search.ranking import rank_candidates
from playground.engine.decode import DecodeLoop, Picked
from playground.engine.forward import keep_last_logits
from playground.engine.kv_cache import kv_cache_bytes
from playground.engine.processors import build_pipeline
from playground.engine.prompt import check_fits_context, encode_prompt
from playground.engine.run_context import RunContext, StopCheck
from playground.engine.run_events import RunRecorder
from playground.engine.step_analysis import analyse_step
from playground.engine.token_text import IncrementalDecoder, TokenTextCache
from playground.events import Event
from playground.events.contrastive_search import SearchCandidate, SearchStarted, SearchStep
from playground.models.anatomy import anatomy_of
from playground.models.loaded import LoadedModel


@contextmanager
def final_norm_outputs(model: Any, into: list[torch.Tensor]) -> Iterator[None]:
    """While inside, every output of the model's final norm ([batch, positions, hidden]) is appended to ``into``."""
    norm = anatomy_of(model).final_norm
    handle = norm.register_forward_hook(lambda module, args, output: into.append(output))
    try:
        yield
    finally:
        handle.remove()


def run_contrastive_search(lm: LoadedModel, settings: RunSettings, context: RunContext | StopCheck | None = None
                           ) -> Iterator[Event]:
    """Contrastive search as a generator of events; settings, prompt, penalties and the model's anatomy are checked
    before it is returned (``ConfigError``)."""
    settings.validate()
    search = settings.group(ContrastiveSearchSettings)
    prompt_ids, prompt_text = encode_prompt(lm, settings)
    check_fits_context(lm, len(prompt_ids), settings)
    anatomy_of(lm.model)  # a family outside the table is refused here, by name
    penalties = build_pipeline(settings, sampling=False, tokenizer=lm.tokenizer,
                               vocab_size=lm.model.config.vocab_size, eos_ids=lm.eos_token_ids)
    loop = DecodeLoop(lm, settings, RunRecorder(lm, settings, RunContext.of(context),
                                                groups=(ContrastiveSearchSettings,)), prompt_ids, prompt_text)
    return _decode(lm, settings, search.penalty_alpha, settings.top_k, loop, penalties)


def _context_texts(tokenizer: Any, ids: list[int]) -> tuple[str, ...]:
    decoder = IncrementalDecoder(tokenizer)
    return tuple(decoder.push(token) for token in ids)


def _decode(lm: LoadedModel, settings: RunSettings, alpha: float, k: int, loop: DecodeLoop,
            penalties: tuple) -> Iterator[Event]:
    model = lm.model
    token_text = TokenTextCache(lm.tokenizer)
    k = min(k, model.config.vocab_size)
    extra = keep_last_logits(model, 1)
    prompt_len = len(loop.prompt_ids)
    outputs: list[torch.Tensor] = []  # what the final norm wrote during the last pass
    context: torch.Tensor | None = None  # [capacity, hidden]: the last hidden state of every position so far
    filled = 0
    logits: torch.Tensor | None = None  # [1, vocab] float: the next token's logits (the winner's, from its row)
    overturned = 0

    def step(index: int, forced: int | None) -> Picked:
        nonlocal logits, filled, overturned
        assert logits is not None and context is not None
        ids = loop.ids.view
        analysis = analyse_step(penalties, ids, logits, settings.num_candidates, record=settings.record_candidates)
        probs = analysis.processed_probs[0]  # [vocab] softmax of the penalised logits
        top_probs, top_ids = torch.topk(probs, k)  # [k]
        rows = top_ids.tolist()
        if forced is not None and forced not in rows:  # branching: the forced token runs as one more row
            rows.append(forced)
        cache = loop.cache
        cache.batch_repeat_interleave(len(rows))
        outputs.clear()
        with loop.watching(), final_norm_outputs(model, outputs):
            out = model(input_ids=torch.tensor(rows, device=lm.device)[:, None], cache=cache, use_cache=True, **extra)
        hidden = outputs[-1][:, -1, :]  # [rows, hidden]
        ranking = rank_candidates(context[:filled], hidden[:k], top_probs, alpha)
        token = rows[ranking.winner] if forced is None else forced
        row = rows.index(token)
        cache.batch_select_indices(torch.tensor([row], device=lm.device))
        context[filled] = hidden[row]
        filled += 1
        logits = out.logits[row : row + 1, -1, :].float()
        analysis.token_id = token
        won = row if row < k else -1  # the token taken among the candidates (a forced one may be outside)
        overturned += ranking.winner != 0 and forced is None
        candidates = tuple(
            SearchCandidate(token_id=t, text=token_text(t), confidence=p, penalty=pen, similar_position=pos,
                            score=s)
            for t, p, pen, pos, s in zip(rows[:k], top_probs.tolist(), ranking.penalty.tolist(),
                                         ranking.similar.tolist(), ranking.score.tolist(), strict=True))
        search_step = SearchStep(step=index, candidates=candidates, token_id=token, text=token_text(token),
                                 winner=won, overturned=ranking.winner != 0, forced=forced is not None)

        def events(texts: list[str], step_ms: float) -> list[Event]:
            return [search_step, analysis.to_event(step=index, text=texts[0], forced=forced is not None,
                                                   step_ms=step_ms, kv_bytes=kv_cache_bytes(loop.cache),
                                                   token_text=token_text)]

        return Picked([token], events)

    yield loop.started()
    yield SearchStarted(alpha=alpha, k=k, context_tokens=_context_texts(lm.tokenizer, loop.prompt_ids))
    with torch.inference_mode():
        with final_norm_outputs(model, outputs):
            read = yield from loop.prefill()
        if read:
            states = torch.cat([o[0] for o in outputs], dim=0)  # [prompt, hidden]
            context = states.new_empty((prompt_len + loop.max_steps, states.shape[-1]))
            context[:prompt_len] = states
            filled = prompt_len
            logits = loop.logits
            outputs.clear()
            yield from loop.steps(step)
    n = len(loop.generated)
    yield loop.finished(figures={"overturned_steps": float(overturned),
                                 "overturned_fraction": overturned / n if n else 0.0})
