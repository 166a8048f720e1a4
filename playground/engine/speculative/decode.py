"""Draft-then-verify decoding: each round a drafter proposes k tokens, the target scores them all in one forward
pass, the longest acceptable prefix is kept, the target adds one token of its own, and both KV caches are rolled
back past the rejected drafts.

Every emitted token also gets an ordinary ``TokenStep`` (raw and processed distributions from the target's logits
at that position), so greedy speculative decoding is observably the target's greedy decoding — only faster or
slower.

Under a constraint (``constrained.py``) the grammar judges each draft before the target's pass, every verified row
is masked at its own matcher state, and the run's grammar follows the kept tokens: greedy speculation is then
constrained greedy decoding, token for token.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from playground.config import RunSettings, SpeculativeSettings
from playground.engine.baseline import plain_greedy
from playground.engine.decode import DecodeLoop, Picked
from playground.engine.forward import deferred_tail, keep_last_logits
from playground.engine.kv_cache import kv_cache_bytes
from playground.engine.processors import NamedTransform, build_pipeline, run_pipeline
from playground.engine.prompt import check_fits_context, encode_prompt
from playground.engine.run_context import NO_CONTEXT, RunContext, StopCheck
from playground.engine.run_events import RunRecorder
from playground.engine.samplers.grammar import Grammar
from playground.engine.speculative.constrained import (
    JudgedDraft,
    constrained_figures,
    count_spans,
    follow_forced,
    follow_round,
    judge_draft,
)
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
from playground.engine.step_analysis import StepAnalysis, analyse_step
from playground.engine.token_text import TokenTextCache
from playground.engine.variants import BuildStopped, FirstLayers, QuantizedCopy, SmallModel, detail, variant
from playground.events import Event
from playground.events.speculative import DraftToken, SpeculativeRound, SpeculativeStarted
from playground.models.loaded import LoadedModel


def run_speculative(lm: LoadedModel, settings: RunSettings, context: RunContext | StopCheck | None = None
                    ) -> Iterator[Event]:
    """Speculative decoding as a generator of events. Settings, prompt and drafter are checked (and a draft model
    loaded, a quantized drafter built, reporting the context's ``progress``) before the generator is returned
    (``ConfigError``); Stop during that build returns a run that ends "stopped" at once."""
    context = RunContext.of(context)
    settings.validate()
    spec = settings.group(SpeculativeSettings)
    prompt_ids, prompt_text = encode_prompt(lm, settings)
    check_fits_context(lm, len(prompt_ids) + len(settings.forced_token_ids), settings)
    generator = context.generator(lm.device, settings.seed)
    # A constraint is carried by the run itself (its matcher follows the emitted tokens, copies of it each draft).
    pipeline = build_pipeline(settings, sampling=spec.do_sample, tokenizer=lm.tokenizer,
                              vocab_size=lm.model.config.vocab_size, eos_ids=lm.eos_token_ids, carried=("grammar",))
    record = RunRecorder(lm, settings, context, groups=(SpeculativeSettings,))
    try:  # the drafter drafts unconstrained: the grammar judges its drafts before the target verifies them
        drafter = make_drafter(lm, spec, tuple(s for s in pipeline if not isinstance(s, Grammar)), generator,
                               context)
    except BuildStopped as stopped:
        return record.stopped_before_start(prompt_ids, prompt_text, (stopped.cut,))
    run = SpeculativeRun(lm, settings, spec, drafter, pipeline, generator,
                         DecodeLoop(lm, settings, record, prompt_ids, prompt_text))
    return run.decode()


def make_drafter(lm: LoadedModel, spec: SpeculativeSettings, pipeline: tuple[NamedTransform, ...],
                 generator: torch.Generator, context: RunContext = NO_CONTEXT) -> Drafter:
    """The drafter the settings name; a model drafter's model comes from the variants' cache (built there,
    reporting the context's ``progress``; ``BuildStopped`` when its Stop comes during the build); the suffix
    drafter learns from the context's run history (default: the model's own)."""
    if spec.draft == "prompt-lookup":
        return PromptLookupDrafter(spec.prompt_lookup_ngram)
    if spec.draft == "jacobi":
        return JacobiDrafter()
    if spec.draft == "suffix":
        return SuffixDrafter(context.history_of(lm).earlier_runs())
    kinds: dict[str, tuple[Any, Any]] = {"layers": (LayersDrafter, FirstLayers(spec.draft_layers)),
             "model": (SmallModelDrafter, SmallModel(spec.draft_model)),
             "quantized": (QuantizedDrafter, QuantizedCopy.quick(spec.draft_quant))}
    kind, request = kinds[spec.draft]
    made = variant(lm, request, context)
    drafter = kind(made.model, pipeline, spec.do_sample, generator, lm.device)
    drafter.detail = detail(made, "the target")
    return drafter


@dataclass
class RoundRecord:
    """One round as drafted, verified and committed: what its ``SpeculativeRound`` and its tokens' steps say."""

    index: int  # the round's number (forced tokens' rounds are not counted)
    first_step: int  # the step of its first token
    tree: DraftTree  # what was drafted (a chain is a tree with one path)
    forcing: bool = False  # branching: the forced tokens are a draft accepted whatever the target says
    draft_ms: float = 0.0
    prompt_read: int = 0  # prompt tokens this round's pass read (the first round reads the prompt's tail)
    # verify: the target's one pass and its verdict
    raw: torch.Tensor | None = None  # [len(tree) + 1, vocab] the target's logits
    target_probs: torch.Tensor | None = None  # the processed distributions
    choices: list[int] = field(default_factory=list)  # the target's argmax at each row (what the drafter learns)
    verdict: Verdict = field(default_factory=lambda: Verdict(0, 0, ()))
    verify_ms: float = 0.0
    # commit: the accepted path, the tokens the round emits, what each was predicted from
    path: list[int] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)  # row j of the pass predicts the round's j-th token
    emitted: list[int] = field(default_factory=list)
    with_target: bool = True  # the target's own token follows the path (there was room for it)
    kv_bytes: int = 0
    analyses: list[StepAnalysis] = field(default_factory=list)
    # under a constraint: the draft as the grammar judged it (``tree`` is then its judged tree), and the tokens of
    # ``emitted`` the run keeps with the reason the constraint ends the run after them
    judged: JudgedDraft | None = None
    keep: int | None = None  # None: all of ``emitted``
    open_rows: list[bool] = field(default_factory=list)  # under a constraint: each row has a token left
    ends: tuple[Any, str] | None = None

    def pass_row(self, row: int) -> int:
        """The target pass's row of verification row ``row`` (they differ where the grammar rejected nodes)."""
        return row if self.judged is None else self.judged.pass_row(row)

    @property
    def pass_nodes(self) -> int:
        """Drafted nodes the target's pass read."""
        return len(self.tree) if self.judged is None else len(self.judged.kept)

    @property
    def is_chain(self) -> bool:
        return self.tree.is_chain()

    def event(self, emitted: int, tree_run: bool, token_text: Callable[[int], str]) -> SpeculativeRound:
        """The round's event, ``emitted`` of its tokens kept (the run may end inside it)."""
        tree, verdict, path, target_probs = self.tree, self.verdict, self.path, self.target_probs
        assert target_probs is not None, "verify first"
        cut = emitted < len(self.emitted)
        leaf = not tree.children(path[-1] if path else -1)
        kind = "none" if cut or not self.with_target else ("bonus" if leaf else "correction")
        # A tree round lists the accepted path first, then the other nodes in tree order (parents before children).
        accepted = set(path)
        order = path + [i for i in range(len(tree)) if i not in accepted]
        where = {node: j for j, node in enumerate(order)}
        ranks = tree.ranks()
        judged = range(len(verdict.draws)) if self.is_chain else verdict.draw_nodes  # the node each draw judged
        draws = dict(zip(judged, verdict.draws, strict=True))
        thresholds = dict(zip(verdict.draw_nodes, verdict.thresholds, strict=True))  # a tree's; a chain's: min(1, p/q)
        drafted = []
        grammar = self.judged  # under a constraint: what the grammar said of each node
        for node in order:
            token = tree.tokens[node]
            row = 0 if tree.parents[node] < 0 else 1 + tree.parents[node]  # the target's row at the node's position
            q = float(tree.probs[node, token]) if tree.probs is not None else 1.0
            # A wider draft head may propose a row the target lacks: the target gives it probability 0 (rejected).
            p = float(target_probs[row, token]) if token < target_probs.shape[-1] else 0.0
            draw = draws.get(node)
            accept_prob = None if draw is None else thresholds.get(node, min(1.0, p / q) if q > 0 else 0.0)
            drafted.append(DraftToken(token_id=token, text=token_text(token), draft_prob=q, target_prob=p,
                                      accepted=node in accepted, draw=draw, rank=ranks[node],
                                      accept_prob=accept_prob,
                                      grammar_rejected=grammar is not None and node in grammar.forbidden,
                                      span=grammar.spans[node] if grammar is not None else "",
                                      allowed=grammar.allowed[node] if grammar is not None else 0))
        last = 1 + path[-1] if path else 0
        # Every round of a tree run carries its parents, a chain-shaped one too (the view tells trees from chains
        # by them).
        parents = () if self.is_chain and not tree_run else \
            tuple(where[p] if p >= 0 else -1 for p in (tree.parents[n] for n in order))
        return SpeculativeRound(
            round=self.index, first_step=self.first_step, emitted=emitted, drafted=tuple(drafted),
            accepted=verdict.accepted, target_token_id=verdict.token_id, target_text=token_text(verdict.token_id),
            target_kind=kind, target_prob=_finite(float(target_probs[last, verdict.token_id])), draft_ms=self.draft_ms,
            verify_ms=self.verify_ms, kv_cache_bytes=self.kv_bytes, prompt_read=self.prompt_read, parents=parents)


@dataclass
class Totals:
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    target_calls: int = 0
    draft_ms: float = 0.0
    verify_ms: float = 0.0
    # under a constraint: drafted, accepted and grammar-rejected nodes per span (forced, inside, outside)
    spans: dict[str, list[int]] | None = None

    def add(self, done: RoundRecord) -> None:
        self.rounds += 1
        self.drafted += len(done.tree)
        self.accepted += done.verdict.accepted
        self.draft_ms += done.draft_ms
        self.verify_ms += done.verify_ms
        if done.judged is not None:
            self.spans = count_spans(self.spans, done.judged, done.path)

    def figures(self) -> dict[str, float]:
        return {
            "rounds": float(self.rounds), "drafted": float(self.drafted), "accepted": float(self.accepted),
            "acceptance_rate": self.accepted / self.drafted if self.drafted else 0.0,
            "mean_accepted": self.accepted / self.rounds if self.rounds else 0.0,
            "target_calls": float(self.target_calls), "draft_ms": self.draft_ms, "verify_ms": self.verify_ms,
            **(constrained_figures(self.spans) if self.spans is not None else {}),
        }


class SpeculativeRun:
    """The run's state between rounds and its step for the decode loop: each round drafts, verifies, commits."""

    def __init__(self, lm: LoadedModel, settings: RunSettings, spec: SpeculativeSettings, drafter: Drafter,
                 pipeline: tuple[NamedTransform, ...], generator: torch.Generator, loop: DecodeLoop) -> None:
        self.lm, self.settings, self.spec, self.drafter = lm, settings, spec, drafter
        self.pipeline, self.generator, self.loop = pipeline, generator, loop
        self.token_text = TokenTextCache(lm.tokenizer)
        self.forced = list(settings.forced_token_ids)
        self.k = spec.draft_k  # tokens to draft next round
        self.tree_run = spec.tree_width > 1  # every round drafts a tree (one may come out chain-shaped)
        self.totals = Totals()
        self.grammar = next((s for s in pipeline if isinstance(s, Grammar)), None)  # the constraint, if any

    def draft(self, ids: list[int]) -> RoundRecord:
        """A chain or a tree from the drafter (or the forced tokens), within the room the budget leaves."""
        generated, room = self.loop.generated, self.loop.max_steps - len(self.loop.generated)
        forcing = len(generated) < len(self.forced)
        start = time.perf_counter()
        if forcing:
            tree = chain(self.forced[len(generated) : len(generated) + room])
        elif room <= 1:
            tree = DraftTree()
        elif self.tree_run:
            tree = self.drafter.propose_tree(ids, min(self.k, room - 1), self.spec.tree_width, self.spec.tree_nodes)
        else:
            drafted = self.drafter.propose(ids, min(self.k, room - 1))
            tree = chain(drafted.tokens[: max(0, room - 1)])
            tree.probs = drafted.probs[: len(tree)] if drafted.probs is not None else None
        judged = None
        if self.grammar is not None:  # drafts the grammar forbids are rejected here, before the target's pass
            judged = follow_forced(self.grammar, tree) if forcing else judge_draft(self.grammar, tree)
            tree = judged.tree
        return RoundRecord(index=self.totals.rounds, first_step=len(generated), tree=tree, forcing=forcing,
                           draft_ms=(time.perf_counter() - start) * 1000, judged=judged)

    def verify(self, done: RoundRecord, ids: list[int]) -> None:
        """The target's one pass over the draft (watched by the loop's observers) and its verdict."""
        cache = self.loop.cache
        done.prompt_read = max(0, len(self.loop.prompt_ids) - cache.get_seq_length())
        judged = done.judged
        with self.loop.watching():  # the lens: every layer's output at the verified positions
            if judged is None:
                done.raw, processed = _score(self.lm, cache, ids, done.tree, self.pipeline)  # [n + 1, vocab]
            else:  # the grammar's nodes: each row with the grammar at its own state, forbidden nodes unread
                read = judged.pass_tree()
                pipelines = [judged.pipeline_at(self.pipeline, 0)] + [
                    judged.pipeline_at(self.pipeline, 1 + node) for node in judged.kept]
                raw, processed = _score(self.lm, cache, ids, read, self.pipeline, pipelines)
                done.raw, processed = judged.rows(raw), judged.rows(processed)  # [len(tree) + 1, vocab]
        self.totals.target_calls += 1
        if judged is not None:  # a row where the constraint and the other samplers left no token
            open_rows = torch.isfinite(processed).any(dim=-1)
            done.open_rows = open_rows.tolist()
            if not all(done.open_rows):  # judged on an even row instead (no NaN draws); the path stops before it
                processed = processed.masked_fill(~open_rows[:, None], 0.0)
        done.verdict, done.target_probs = _verify(done.tree, processed, self.spec.do_sample, self.generator,
                                                  done.forcing)
        done.choices = processed.argmax(dim=-1).tolist()

    def commit(self, done: RoundRecord, ids: list[int]) -> None:

        tree, verdict, cache = done.tree, done.verdict, self.loop.cache
        room = self.loop.max_steps - len(self.loop.generated)
        done.path = list(verdict.path) if not done.is_chain else list(range(verdict.accepted))
        done.rows = [0] + [1 + node for node in done.path]
        blocked = next((j for j, row in enumerate(done.rows) if not done.open_rows[row]), None) \
            if done.open_rows else None
        if blocked is not None and blocked < len(done.path):  # no token was left where path[blocked] was drafted
            del done.path[blocked:], done.rows[blocked + 1 :]
            verdict = done.verdict = dataclasses.replace(verdict, accepted=blocked, path=tuple(done.path)
                                                         if not done.is_chain else ())
        # The target's token after the kept path comes in the round only when there is room for it.
        done.emitted = [tree.tokens[node] for node in done.path]
        done.with_target = len(done.emitted) < room
        last = done.rows[-1]
        if done.open_rows and not done.open_rows[last]:  # no token can follow the path: the run ends after it
            done.with_target = False
            assert done.judged is not None
            allowed = int(done.judged.states[last - 1].allowed().mask.sum().item())
            done.ends = ("grammar_blocked", f"no token is left: the constraint allows {allowed} here and the other "
                         "samplers removed them all" if allowed else "the constraint allows no token here")
        if done.with_target:
            done.emitted.append(verdict.token_id)
        kept = len(ids) + verdict.accepted  # positions the target cache keeps (the target's token is not read)
        if done.is_chain:
            roll_back(cache, kept)
        else:
            keep_path(cache, len(ids), [done.pass_row(1 + node) - 1 for node in done.path])
        choices = done.choices
        self.drafter.after_round(kept, [choices[row] for row in done.rows] if not done.is_chain else choices,
                                 verdict.accepted, path_tokens=done.emitted[: verdict.accepted])

    def record_steps(self, done: RoundRecord, ids: list[int]) -> None:
        """Each emitted token's analysis (part of the round's time, as a plain step's is): token j follows ids +
        the round's first j tokens (every emitted token but the last is an accepted draft)."""
        line = torch.tensor([ids + done.emitted], device=self.lm.device)  # token j follows its first len(ids) + j
        assert done.raw is not None
        judged = done.judged
        for j, token in enumerate(done.emitted):
            row = done.rows[j]
            pipeline = self.pipeline if judged is None else judged.pipeline_at(self.pipeline, row)
            analysis = analyse_step(pipeline, line[:, : len(ids) + j], done.raw[row : row + 1],
                                    self.settings.num_candidates)
            analysis.token_id = token
            if judged is not None:  # what the mask did at this token's position (as a plain constrained step)
                top = analysis.top_ids[0] if analysis.top_ids else int(done.raw[row].argmax().item())
                analysis.grammar = judged.states[row - 1].step_record(analysis.raw_probs(), top)
            done.analyses.append(analysis)
        if judged is not None and self.grammar is not None:  # the run's grammar follows the kept tokens
            done.keep, ends = follow_round(self.grammar, judged, done.path, done.emitted)
            done.ends = ends or done.ends

    def step(self, _index: int, _forced: int | None) -> Picked:
        """One round: draft, verify in one target pass, commit the accepted path."""
        ids = self.loop.prompt_ids + self.loop.generated  # prompt + emitted tokens
        done = self.draft(ids)
        start = time.perf_counter()
        self.verify(done, ids)
        self.commit(done, ids)
        done.verify_ms = (time.perf_counter() - start) * 1000
        done.kv_bytes = kv_cache_bytes(self.loop.cache)
        self.record_steps(done, ids)
        if not done.forcing:
            if self.spec.adaptive_k and len(done.tree):
                depth = max(done.tree.depths()) + 1
                self.k = next_draft_length(self.k, min(done.verdict.accepted, depth), depth)
            self.totals.add(done)
        assert done.raw is not None  # verified
        emitted = done.rows[: len(done.emitted)]
        return Picked(done.emitted[: done.keep], lambda texts, ms: self.events(done, texts, ms),
                      logits=done.raw[emitted], ends=done.ends,
                      seen=[(0, done.pass_row(row) - done.pass_nodes - 1) for row in emitted])

    def events(self, done: RoundRecord, texts: list[str], round_ms: float) -> list[Event]:
        n = len(texts)  # the loop cut the round at an end (EOS, a stop string)
        out: list[Event] = [] if done.forcing else [done.event(n, self.tree_run, self.token_text)]
        out += [done.analyses[j].to_event(step=done.first_step + j, text=texts[j],
                                          forced=done.forcing and j < len(done.tree), step_ms=round_ms / n,
                                          kv_bytes=done.kv_bytes, token_text=self.token_text) for j in range(n)]
        return out

    def decode(self) -> Iterator[Event]:
        loop, spec, drafter = self.loop, self.spec, self.drafter
        yield loop.started()
        tree_width = spec.tree_width if spec.tree_width > 1 else 1
        yield SpeculativeStarted(drafter=drafter.name, detail=drafter.detail, draft_k=spec.draft_k,
                                 do_sample=spec.do_sample, baseline_tokens=spec.baseline_tokens,
                                 tree_width=tree_width, tree_nodes=spec.tree_nodes if tree_width > 1 else 0,
                                 constraint=self.grammar.kind if self.grammar is not None else "")
        with torch.inference_mode():
            # The prompt's tail (all of a short prompt) is read by the first verification pass together with the
            # first draft: one target pass fewer than a separate prefill, as in transformers' assisted generation.
            if (yield from loop.prefill(defer=deferred_tail(len(loop.prompt_ids)))):
                self.totals.target_calls += loop.record.prefill_passes
                yield from loop.steps(self.step)
        figures = self.totals.figures()
        generated, stop_reason = loop.generated, loop.stop_reason
        cut_short: tuple[str, ...] = ()
        if spec.baseline_tokens and generated:
            wanted = min(spec.baseline_tokens, len(generated))
            baseline_ids, baseline = ([], 0.0) if stop_reason == "stopped" else \
                plain_greedy(self.lm, self.settings, loop.prompt_ids, wanted, loop.context)
            if len(baseline_ids) < wanted:  # Stop came before or during the baseline: no speed-up to report
                stop_reason, cut_short = "stopped", ("baseline",)
            else:
                figures["baseline_tokens_per_s"] = baseline
        grammar = self.grammar
        if grammar is not None and stop_reason == loop.budget_reason and grammar.incomplete():
            stop_reason, loop.stop_note = "grammar_incomplete", grammar.incomplete()
        loop.stop_reason, loop.cut_short = stop_reason, cut_short
        finished = loop.finished()
        if "baseline_tokens_per_s" in figures:
            baseline = figures["baseline_tokens_per_s"]
            figures["speedup"] = finished.tokens_per_s / baseline if baseline > 0 else 0.0
        yield dataclasses.replace(finished, figures=figures)


def _finite(value: float) -> float:
    """0 for a row the constraint left empty (its softmax is NaN)."""
    return value if value == value else 0.0


def next_draft_length(k: int, accepted: int, drafted: int) -> int:
    """transformers' "heuristic" schedule: a fully accepted draft earns two more tokens, a rejection costs one."""
    return min(16, k + 2) if accepted == drafted else max(1, k - 1)


def _score(lm: LoadedModel, cache: Any, ids: list[int], tree: DraftTree, pipeline: tuple[NamedTransform, ...],
           pipelines: list[tuple[NamedTransform, ...]] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's raw and processed logits [len(tree) + 1, vocab] in one forward pass over what the cache has
    not read (the last emitted token; the prompt's tail in the first round) + the drafted nodes: row 0 predicts
    the token after ``ids``, row 1 + i the token after node i's path. A tree's nodes see only their ancestors
    (``tree_inputs``); a chain needs no mask of its own. ``pipelines``: each row's own chain (a constraint's rows
    each have the grammar at their own state), else ``pipeline`` for every row."""
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
    if not pipeline and not pipelines:
        return raw, raw
    # Each row's context: a chain's are prefixes of one tensor; a tree node's is the context + its own path.
    context = torch.tensor([ids + (tree.tokens if tree.is_chain() else [])], device=lm.device)
    contexts = [context[:, : len(ids) + j] for j in range(rows)] if tree.is_chain() else \
        [context] + [torch.cat([context, context.new_tensor([tree.path_tokens(i)])], dim=1) for i in range(len(tree))]
    chains = pipelines if pipelines is not None else [pipeline] * rows
    processed = torch.cat([run_pipeline(chains[j], c, raw[j : j + 1]) for j, c in enumerate(contexts)])
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
