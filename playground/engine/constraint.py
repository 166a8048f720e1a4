"""A constraint (``--json-schema``, ``--regex``, ``--grammar``, ``--choices``) on the strategies that pick tokens
without the greedy/sample loop's ``SamplerRun``: beam search, contrastive decoding and cascade.

``apart`` splits the settings into the chain without the constraint and the constraint's own ``Grammar`` (the
sampler of ``playground.engine.samplers.grammar``, built the same way, its refusals and messages included). The
chain's other stages keep a forbidden token forbidden (they add to, scale or cut logits: ``-inf`` stays ``-inf``), so
applying the mask after them gives the same scores as at the constraint's place in the chain; the strategies that
record stages append it to the chain (``with_grammar``), so a forbidden candidate says it was cut by "grammar".

``BeamMasks``: one matcher per running beam (a ``Grammar`` each). ``apply`` masks each beam's row by its own
matcher and records what the mask did per beam (``GrammarStep``); ``follow`` makes the next step's matchers from the
surviving beams' parents (a ``deep_copy`` where a beam splits, the parent's own matcher where it has one child) and
advances each by its token. A beam the constraint leaves no token drops out of the search (beam search's
``allowed_only`` and ``live``): the beams are fewer than ``num_beams`` while fewer continuations are allowed.
"""

from __future__ import annotations

from typing import Any

import torch

from playground.config import RunSettings
from playground.config.samplers.grammar import GrammarSettings
from playground.engine.processors import NamedTransform, SamplerRun, build_pipeline
from playground.engine.samplers.base import BuildContext
from playground.engine.samplers.grammar import Grammar
from playground.events import BeamSequence, StopReason
from playground.events.grammar import GrammarStep

NEG_INF = float("-inf")


def without_constraint(settings: RunSettings) -> RunSettings:
    """The settings with no constraint (the chain the strategy builds itself)."""
    return settings.replace(groups=tuple(g for g in settings.groups if not isinstance(g, GrammarSettings)))


def apart(settings: RunSettings, tokenizer: Any, vocab_size: int | None, eos_ids: tuple[int, ...]
          ) -> tuple[RunSettings, Grammar | None]:
    """(the settings without the constraint, the constraint's ``Grammar`` or None when there is none).
    ``ConfigError`` (the library's message) for a constraint that cannot be built."""
    if not settings.group(GrammarSettings).active():
        return settings, None
    context = BuildContext(tokenizer=tokenizer, vocab_size=vocab_size, strategy=settings.strategy,
                           eos_ids=tuple(eos_ids))
    grammar = Grammar.build(settings, context)
    assert isinstance(grammar, Grammar)
    return without_constraint(settings), grammar


def constrained_chain(settings: RunSettings, *, sampling: bool, tokenizer: Any, vocab_size: int | None,
                      eos_ids: tuple[int, ...], part: str = "all") -> tuple[tuple[NamedTransform, ...], Grammar | None]:
    """The run's chain with the constraint at its place in the order (before the samplers that shape the drawn
    distribution), and the constraint (None without one): for a strategy that picks one sequence's tokens itself
    and calls the constraint's ``accept`` after each. The chain is first built without the constraint, so every
    other sampler that needs the greedy/sample loop's state (guidance, mirostat, XTC, Adaptive-P, bans) is refused
    by name as before."""
    plain = build_pipeline(without_constraint(settings), sampling=sampling, tokenizer=tokenizer, part=part)
    if not settings.group(GrammarSettings).active():
        return plain, None
    run = SamplerRun(generator=torch.Generator())  # only the constraint is built with it (the rest refused above)
    chain = build_pipeline(settings, sampling=sampling, tokenizer=tokenizer, vocab_size=vocab_size, run=run,
                           part=part, eos_ids=eos_ids)
    return chain, run.grammar


def blocked(logits: torch.Tensor) -> bool:
    """No token is left (every logit -inf)."""
    return not bool(torch.isfinite(logits).any())


def fit(mask: torch.Tensor, width: int) -> torch.Tensor:
    """A [vocab] mask as wide as a model's logits (rows past the tokenizer's vocabulary are forbidden)."""
    if mask.shape[-1] == width:
        return mask
    return torch.cat([mask, mask.new_zeros(max(0, width - mask.shape[-1]))])[:width]


def twin(grammar: Grammar) -> Grammar:
    """A copy of the constraint in its state (its own matcher, a ``deep_copy``)."""
    copy = grammar.clone()
    assert isinstance(copy, Grammar)
    return copy


class BeamMasks:
    """The constraint's matcher of each running beam, in the search's row order."""

    def __init__(self, grammar: Grammar) -> None:
        self.start = twin(grammar)  # the constraint before any token (to judge a returned sequence)
        self.rows: list[Grammar] = [grammar]  # the prompt: one row

    def prefix(self, tokens: list[int]) -> None:
        """The forced prefix every beam starts from (a branch's tokens), read by the one row there is."""
        for t in tokens:
            self.rows[0].accept(t, 1.0)

    def apply(self, logits: torch.Tensor, log_probs: torch.Tensor) -> tuple[torch.Tensor, tuple[GrammarStep, ...]]:
        """``log_probs`` [rows, vocab] with each row's forbidden tokens at ``-inf``, and each row's record against
        its raw distribution (softmax of ``logits`` [rows, vocab])."""
        assert len(self.rows) == log_probs.shape[0], (len(self.rows), log_probs.shape)
        width = log_probs.shape[-1]
        # A row whose matcher a forced token broke allows nothing: the search ends there ("grammar_blocked").
        masks = torch.stack([fit(g.allowed().mask, width) & (not g.broken) for g in self.rows]
                            ).to(log_probs.device)  # [rows, vocab]
        # The record of every row at once (as ``Grammar.step_record``): the count, the raw mass removed, the top.
        raw = logits.float().softmax(dim=-1)  # [rows, vocab]
        tops = raw.argmax(dim=-1, keepdim=True)  # [rows, 1]
        removed = raw.double().masked_fill(masks, 0.0).sum(dim=-1).tolist()
        counts = masks.sum(dim=-1).tolist()
        top_forbidden = (~masks.gather(1, tops))[:, 0].tolist()
        records = tuple(GrammarStep(allowed=int(n), removed_mass=float(m), top_forbidden=bool(f),
                                    ff_tokens=g.allowed().ff_tokens)
                        for g, n, m, f in zip(self.rows, counts, removed, top_forbidden, strict=True))
        return log_probs.masked_fill(~masks, NEG_INF), records

    def follow(self, parents: list[int], tokens: list[int]) -> None:
        """The next step's rows: beam ``k`` grew from row ``parents[k]`` by ``tokens[k]``."""
        children: dict[int, int] = {}
        for p in parents:
            children[p] = children.get(p, 0) + 1
        rows = []
        for p, t in zip(parents, tokens, strict=True):
            children[p] -= 1
            grammar = self.rows[p] if children[p] == 0 else twin(self.rows[p])  # the last child takes the parent's
            grammar.accept(t, 1.0)
            rows.append(grammar)
        self.rows = rows

    def ending(self, best: BeamSequence | None, reason: StopReason) -> tuple[StopReason, str]:
        """The search's stop reason and note with the constraint: "grammar_blocked" when no beam was left
        (every one without an allowed token), "grammar_incomplete" when the best sequence leaves the constraint
        unfinished (the budget ended first); else ``reason`` as it was."""
        if best is None:
            why = self.rows[0].broken if self.rows and self.rows[0].broken else "no beam has a token it allows"
            return "grammar_blocked", f"the constraint cannot follow: {why}"
        note = self.incomplete(list(best.token_ids))
        return ("grammar_incomplete", note) if note else (reason, "")

    def incomplete(self, token_ids: list[int]) -> str:
        """Why ``token_ids`` (a returned sequence) leaves the constraint unfinished ("" when it accepts them)."""
        judge = twin(self.start)
        for t in token_ids:
            judge.accept(t, 1.0)
            if judge.broken or judge.finished() is not None:
                break
        if judge.broken:
            return f"the best sequence does not keep to the constraint: {judge.broken}"
        return judge.incomplete()
