"""Draft-then-verify decoding: each round a drafter proposes k tokens, the target scores them all in one forward
pass, the longest acceptable prefix is kept, the target adds one token of its own, and both KV caches are rolled
back past the rejected drafts.

Every emitted token also gets an ordinary ``TokenStep`` (raw and processed distributions from the target's logits
at that position), so greedy speculative decoding is observably the target's greedy decoding — only faster or
slower.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from typing import Any

import torch

from playground.config import LayerSettings, LensSettings, RunSettings, SpeculativeSettings
from playground.engine.baseline import plain_greedy
from playground.engine.decode import DecodeLoop, Picked
from playground.engine.forward import deferred_tail, keep_last_logits
from playground.engine.kv_cache import kv_cache_bytes
from playground.engine.layers.lens import LayerOutputs, LensRecorder, layers_started
from playground.engine.processors import NamedTransform, build_pipeline, run_pipeline
from playground.engine.prompt import check_fits_context, encode_prompt
from playground.engine.run_events import RunRecorder
from playground.engine.sampling import make_generator
from playground.engine.speculative.drafters import (
    Drafter,
    JacobiDrafter,
    LayersDrafter,
    PromptLookupDrafter,
    QuantizedDrafter,
    SmallModelDrafter,
    keep_past,
    roll_back,
)
from playground.engine.speculative.suffix import SuffixDrafter
from playground.engine.speculative.tree import DraftTree, chain
from playground.engine.speculative.tree_pass import keep_path, tree_inputs
from playground.engine.speculative.verify import (
    Verdict,
    verify_greedy,
    verify_sampled,
    verify_tree_greedy,
    verify_tree_sampled,
)
from playground.engine.step_analysis import analyse_step
from playground.engine.token_text import TokenTextCache
from playground.engine.variants import BuildStopped, FirstLayers, Progress, QuantizedCopy, SmallModel, detail, variant
from playground.events import Event
from playground.events.speculative import DraftToken, SpeculativeRound, SpeculativeStarted
from playground.models.loaded import LoadedModel

StopCheck = Callable[[], bool]


def run_speculative(lm: LoadedModel, settings: RunSettings, should_stop: StopCheck | None = None,
                    progress: Progress | None = None) -> Iterator[Event]:
    """Speculative decoding as a generator of events. Settings, prompt and drafter are checked (and a draft model
    loaded, a quantized drafter built, reporting ``progress``) before the generator is returned (``ConfigError``);
    Stop during that build returns a run that ends "stopped" at once."""
    settings.validate()
    spec = settings.group(SpeculativeSettings)
    prompt_ids, prompt_text = encode_prompt(lm, settings)
    check_fits_context(lm, len(prompt_ids) + len(settings.forced_token_ids), settings)
    generator = make_generator(lm.device, settings.seed)
    pipeline = build_pipeline(settings, sampling=spec.do_sample, tokenizer=lm.tokenizer)
    record = RunRecorder(lm, settings, should_stop, groups=(SpeculativeSettings,))
    try:
        drafter = make_drafter(lm, spec, pipeline, generator, progress, should_stop)
    except BuildStopped as stopped:
        return record.stopped_before_start(prompt_ids, prompt_text, (stopped.cut,))
    lens_settings = settings.group(LensSettings)
    lens = LensRecorder(lm.model, lens_settings, TokenTextCache(lm.tokenizer)) if lens_settings.lens else None
    return _decode(lm, settings, spec, drafter, pipeline, generator, prompt_ids, prompt_text, record, lens)


def make_drafter(lm: LoadedModel, spec: SpeculativeSettings, pipeline: tuple[NamedTransform, ...],
                 generator: torch.Generator, progress: Progress | None = None,
                 should_stop: StopCheck | None = None) -> Drafter:
    """The drafter the settings name; a model drafter's model comes from the variants' cache (built there, with
    ``progress``; ``BuildStopped`` when ``should_stop`` says so during the build)."""
    if spec.draft == "prompt-lookup":
        return PromptLookupDrafter(spec.prompt_lookup_ngram)
    if spec.draft == "jacobi":
        return JacobiDrafter()
    if spec.draft == "suffix":
        return SuffixDrafter(lm.model)
    kinds: dict[str, tuple[Any, Any]] = {"layers": (LayersDrafter, FirstLayers(spec.draft_layers)),
             "model": (SmallModelDrafter, SmallModel(spec.draft_model)),
             "quantized": (QuantizedDrafter, QuantizedCopy.quick(spec.draft_quant))}
    kind, request = kinds[spec.draft]
    made = variant(lm, request, progress, should_stop)
    drafter = kind(made.model, pipeline, spec.do_sample, generator, lm.device)
    drafter.detail = detail(made, "the target")
    return drafter


def _decode(lm: LoadedModel, settings: RunSettings, spec: SpeculativeSettings, drafter: Drafter,
            pipeline: tuple[NamedTransform, ...], generator: torch.Generator, prompt_ids: list[int],
            prompt_text: str, record: RunRecorder, lens: LensRecorder | None) -> Iterator[Event]:
    token_text = TokenTextCache(lm.tokenizer)
    loop = DecodeLoop(lm, settings, record, prompt_ids, prompt_text)
    forced = list(settings.forced_token_ids)
    k = spec.draft_k  # tokens to draft next round
    tree_run = spec.tree_width > 1  # every round drafts a tree (one may come out chain-shaped)
    rounds = drafted_total = accepted_total = target_calls = 0
    draft_ms_total = verify_ms_total = 0.0

    def step(_index: int, _forced: int | None) -> Picked:
        """One round: draft a chain or a tree (or take the forced tokens), verify it in one target pass, keep the
        accepted path in the caches."""
        nonlocal k, rounds, drafted_total, accepted_total, target_calls, draft_ms_total, verify_ms_total
        generated, cache = loop.generated, loop.cache
        ids = prompt_ids + generated  # prompt + emitted tokens
        room = loop.max_steps - len(generated)
        forcing = len(generated) < len(forced)
        start = time.perf_counter()
        if forcing:  # branching: the forced tokens are a draft that is accepted whatever the target says
            tree = chain(forced[len(generated) : len(generated) + room])
        elif room <= 1:
            tree = DraftTree()
        elif tree_run:
            tree = drafter.propose_tree(ids, min(k, room - 1), spec.tree_width, spec.tree_nodes)
        else:
            draft = drafter.propose(ids, min(k, room - 1))
            tree = chain(draft.tokens[: max(0, room - 1)])
            tree.probs = draft.probs[: len(tree)] if draft.probs is not None else None
        is_chain = tree.is_chain()
        draft_ms = (time.perf_counter() - start) * 1000
        start = time.perf_counter()
        prompt_read = max(0, len(prompt_ids) - cache.get_seq_length())
        captured: Any = LayerOutputs(lens.stack, len(tree) + 1) if lens is not None else nullcontext()
        with captured:  # the lens: every layer's output at the verified positions
            raw, processed = _score(lm, cache, ids, tree, pipeline)  # [n + 1, vocab]
        target_calls += 1
        verdict, target_probs = _verify(tree, processed, spec.do_sample, generator, forcing)
        path = list(verdict.path) if not is_chain else list(range(verdict.accepted))
        rows = [0] + [1 + node for node in path]  # row j of the pass predicts the j-th token of the round
        # The target's token after the kept path comes in the round only when there is room for it.
        emitted = [tree.tokens[node] for node in path]
        with_target = len(emitted) < room
        if with_target:
            emitted = [*emitted, verdict.token_id]
        kept = len(ids) + verdict.accepted  # positions the target cache keeps (the target's token is not read)
        if is_chain:
            roll_back(cache, kept)
        else:
            keep_path(cache, len(ids), path)
        choices = processed.argmax(dim=-1).tolist()
        drafter.after_round(kept, [choices[row] for row in rows] if not is_chain else choices, verdict.accepted,
                            path_tokens=emitted[: verdict.accepted])
        verify_ms = (time.perf_counter() - start) * 1000
        first_step = len(generated)
        kv_bytes = kv_cache_bytes(cache)
        # Recording the round's tokens is part of its time, as a plain step's is: token j follows ids + the
        # round's first j tokens (every emitted token but the last is an accepted draft).
        analyses = []
        line = torch.tensor([ids + emitted], device=lm.device)  # one tensor: token j follows its first len(ids) + j
        for j, token in enumerate(emitted):
            analysis = analyse_step(pipeline, line[:, : len(ids) + j], raw[rows[j] : rows[j] + 1],
                                    settings.num_candidates)
            analysis.token_id = token
            analyses.append(analysis)
        lens_steps = [captured.step_event(rows[j], first_step + j, lens.top, token_text, raw[rows[j]])
                      for j in range(len(emitted))] if lens is not None else []
        if not forcing:
            if spec.adaptive_k and len(tree):
                depth = max(tree.depths()) + 1
                k = next_draft_length(k, min(verdict.accepted, depth), depth)
            rounds += 1
            drafted_total += len(tree)
            accepted_total += verdict.accepted
            draft_ms_total += draft_ms
            verify_ms_total += verify_ms
        round_index = rounds - 1

        def events(texts: list[str], round_ms: float) -> list[Event]:
            n = len(texts)  # the loop cut the round at an end (EOS, a stop string)
            steps = [analyses[j].to_event(step=first_step + j, text=texts[j], forced=forcing and j < len(tree),
                                          step_ms=round_ms / n, kv_bytes=kv_bytes, token_text=token_text)
                     for j in range(n)]
            out: list[Event] = []
            if not forcing:
                cut = n < len(emitted)  # the run ended inside the round
                leaf = not tree.children(path[-1] if path else -1)
                out.append(_round_event(round_index, first_step, n, tree, is_chain, tree_run, verdict, path,
                                        target_probs, lm, token_text, "none" if cut or not with_target else
                                        ("bonus" if leaf else "correction"),
                                        draft_ms, verify_ms, kv_bytes, prompt_read))
            for j, token_step in enumerate(steps):
                if lens_steps:
                    out.append(lens_steps[j])
                out.append(token_step)
            return out

        return Picked(emitted, events)

    yield loop.started()
    tree_width = spec.tree_width if spec.tree_width > 1 else 1
    yield SpeculativeStarted(drafter=drafter.name, detail=drafter.detail, draft_k=spec.draft_k,
                             do_sample=spec.do_sample, baseline_tokens=spec.baseline_tokens, tree_width=tree_width,
                             tree_nodes=spec.tree_nodes if tree_width > 1 else 0)
    if lens is not None:
        yield layers_started("lens", lens.stack.count, settings.group(LensSettings), LayerSettings(), kv_fill="")
    with torch.inference_mode():
        # The prompt's tail (all of a short prompt) is read by the first verification pass together with the first
        # draft: one target pass fewer than a separate prefill, as in transformers' assisted generation.
        if (yield from loop.prefill(defer=deferred_tail(len(prompt_ids)))):
            target_calls += record.prefill_passes
            yield from loop.steps(step)
    generated, stop_reason = loop.generated, loop.stop_reason

    figures = {
        "rounds": float(rounds), "drafted": float(drafted_total), "accepted": float(accepted_total),
        "acceptance_rate": accepted_total / drafted_total if drafted_total else 0.0,
        "mean_accepted": accepted_total / rounds if rounds else 0.0,
        "target_calls": float(target_calls), "draft_ms": draft_ms_total, "verify_ms": verify_ms_total,
    }
    cut_short: tuple[str, ...] = ()
    if spec.baseline_tokens and generated:
        wanted = min(spec.baseline_tokens, len(generated))
        baseline_ids, baseline = ([], 0.0) if stop_reason == "stopped" else \
            plain_greedy(lm, settings, prompt_ids, wanted, record.should_stop)
        if len(baseline_ids) < wanted:  # Stop came before or during the baseline: no speed-up to report
            stop_reason, cut_short = "stopped", ("baseline",)
        else:
            figures["baseline_tokens_per_s"] = baseline
    loop.stop_reason, loop.cut_short = stop_reason, cut_short
    finished = loop.finished()
    if "baseline_tokens_per_s" in figures:
        baseline = figures["baseline_tokens_per_s"]
        figures["speedup"] = finished.tokens_per_s / baseline if baseline > 0 else 0.0
    yield dataclasses.replace(finished, figures=figures)


def next_draft_length(k: int, accepted: int, drafted: int) -> int:
    """transformers' "heuristic" schedule: a fully accepted draft earns two more tokens, a rejection costs one."""
    return min(16, k + 2) if accepted == drafted else max(1, k - 1)


def _score(lm: LoadedModel, cache: Any, ids: list[int], tree: DraftTree,
           pipeline: tuple[NamedTransform, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's raw and processed logits [len(tree) + 1, vocab] in one forward pass over what the cache has
    not read (the last emitted token; the prompt's tail in the first round) + the drafted nodes: row 0 predicts
    the token after ``ids``, row 1 + i the token after node i's path. A tree's nodes see only their ancestors
    (``tree_inputs``); a chain needs no mask of its own."""
    keep_past(cache)  # the pass may be rolled back, also across a sliding window
    tail = ids[cache.get_seq_length():]
    rows = len(tree) + 1
    extra = {}
    if not tree.is_chain():
        mask, positions = tree_inputs(lm.model, cache, len(tail), tree, lm.device)
        extra = {"attention_mask": mask, "position_ids": positions}
    out = lm.model(input_ids=torch.tensor([tail + tree.tokens], device=lm.device), cache=cache, use_cache=True,
                   **keep_last_logits(lm.model, rows), **extra)
    raw = out.logits[0, -rows:].float()
    if not pipeline:
        return raw, raw
    # Each row's context: a chain's are prefixes of one tensor; a tree node's is the context + its own path.
    context = torch.tensor([ids + (tree.tokens if tree.is_chain() else [])], device=lm.device)
    contexts = [context[:, : len(ids) + j] for j in range(rows)] if tree.is_chain() else \
        [context] + [torch.cat([context, context.new_tensor([tree.path_tokens(i)])], dim=1) for i in range(len(tree))]
    processed = torch.cat([run_pipeline(pipeline, c, raw[j : j + 1]) for j, c in enumerate(contexts)])
    return raw, processed


def _verify(tree: DraftTree, processed: torch.Tensor, sample: bool, generator: torch.Generator,
            forcing: bool) -> tuple[Verdict, torch.Tensor]:
    probs = processed.softmax(dim=-1)
    if forcing:
        choice = int(torch.multinomial(probs[-1], 1, generator=generator).item()) if sample else \
            int(processed[-1].argmax().item())
        return Verdict(len(tree), choice, ()), probs
    if not tree.is_chain():
        if not sample:
            return verify_tree_greedy(tree, processed.argmax(dim=-1).tolist()), probs
        return verify_tree_sampled(tree, probs, generator), probs
    if not sample:
        return verify_greedy(tree.tokens, processed), probs
    q = tree.probs
    if q is None:  # a deterministic drafter: q is one-hot on each drafted token
        q = torch.zeros((len(tree), probs.shape[-1]), device=probs.device)
        if len(tree):
            q[torch.arange(len(tree)), torch.tensor(tree.tokens, device=probs.device)] = 1.0
    return verify_sampled(tree.tokens, q, probs, generator), probs


def _round_event(index: int, first_step: int, emitted: int, tree: DraftTree, is_chain: bool, tree_run: bool,
                 verdict: Verdict, path: list[int], target_probs: torch.Tensor, lm: LoadedModel,
                 token_text: TokenTextCache, kind: str, draft_ms: float, verify_ms: float, kv_bytes: int,
                 prompt_read: int) -> SpeculativeRound:
    # A tree round lists the accepted path first, then the other nodes in tree order (parents before children).
    accepted = set(path)
    order = path + [i for i in range(len(tree)) if i not in accepted]
    where = {node: j for j, node in enumerate(order)}
    ranks = tree.ranks()
    judged = range(len(verdict.draws)) if is_chain else verdict.draw_nodes  # the node each draw judged
    draws = dict(zip(judged, verdict.draws, strict=True))
    thresholds = dict(zip(verdict.draw_nodes, verdict.thresholds, strict=True))  # a tree's; a chain's: min(1, p/q)
    drafted = []
    for node in order:
        token = tree.tokens[node]
        row = 0 if tree.parents[node] < 0 else 1 + tree.parents[node]  # the target's row at the node's position
        q = float(tree.probs[node, token]) if tree.probs is not None else 1.0
        # A wider draft head may propose a row the target lacks: the target gives it probability 0 (rejected).
        p = float(target_probs[row, token]) if token < target_probs.shape[-1] else 0.0
        draw = draws.get(node)
        accept_prob = None if draw is None else thresholds.get(node, min(1.0, p / q) if q > 0 else 0.0)
        drafted.append(DraftToken(token_id=token, text=token_text(token), draft_prob=q, target_prob=p,
                                  accepted=node in accepted, draw=draw, rank=ranks[node], accept_prob=accept_prob))
    last = 1 + path[-1] if path else 0
    target_prob = float(target_probs[last, verdict.token_id])
    # Every round of a tree run carries its parents, a chain-shaped one too (the view tells trees from chains by them).
    parents = () if is_chain and not tree_run else \
        tuple(where[p] if p >= 0 else -1 for p in (tree.parents[n] for n in order))
    return SpeculativeRound(
        round=index, first_step=first_step, emitted=emitted, drafted=tuple(drafted), accepted=verdict.accepted,
        target_token_id=verdict.token_id, target_text=token_text(verdict.token_id), target_kind=kind,
        target_prob=target_prob, draft_ms=draft_ms, verify_ms=verify_ms, kv_cache_bytes=kv_bytes,
        prompt_read=prompt_read, parents=parents)
