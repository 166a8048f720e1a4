"""What a decoding step looked like: raw vs processed distribution, top candidates, what each processor did.

Computed on the model's device with a handful of reductions, converted to plain values once per step.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from playground.engine.processors import NamedTransform
from playground.engine.samplers.chain import CompactLogits, Kept, Stage, run_chain, values_at
from playground.events import Candidate, ProcessorEffect, TokenStep
from playground.events.grammar import GrammarStep
from playground.events.run import TAIL_POWERS, RawCandidates, WholeVocabulary

LN2 = math.log(2)


@dataclass
class StepAnalysis:
    raw_logits: torch.Tensor  # [1, vocab]
    raw_logprobs: torch.Tensor  # [1, vocab]
    stage_logits: list[tuple[str, Stage]]  # after each processor: [1, vocab], or on the compact set after a cut
    processed_logits: torch.Tensor  # [1, vocab], after the whole pipeline
    processed_probs: torch.Tensor  # [1, vocab]
    top_ids: list[int]  # top candidates by raw probability
    token_id: int = -1  # set once the strategy has chosen
    mirostat_mu: float | None = None  # mirostat v2's cut at this step (set by a sampling run with mirostat on)
    extra: dict = field(default_factory=dict)
    # The chain ran on a compact set after its first cut: the tokens still in play and their processed probabilities
    # ([1, K]); None when it ran on the whole vocabulary.
    kept: Kept | None = None
    kept_probs: torch.Tensor | None = None
    raw_top: RawCandidates | None = None  # the likeliest raw tokens, packed for the what-if (``record`` > 0)
    known_raw_probs: torch.Tensor | None = None  # [1, vocab] exp(raw_logprobs), when the recording already took it
    grammar: GrammarStep | None = None  # what a constraint's mask did (set by a run with one)

    def raw_probs(self) -> torch.Tensor:
        return self.known_raw_probs if self.known_raw_probs is not None else self.raw_logprobs.exp()

    def draw(self, generator: torch.Generator) -> int:
        """A token drawn from the processed distribution (on the compact set when there is one: a draw over the whole
        vocabulary costs ~2 ms for its 49k exponentials)."""
        if self.kept is not None and self.kept_probs is not None:
            return int(self.kept.ids[torch.multinomial(self.kept_probs, num_samples=1, generator=generator)].item())
        return int(torch.multinomial(self.processed_probs, num_samples=1, generator=generator).item())

    def to_event(
        self, *, step: int, text: str, forced: bool, step_ms: float, kv_bytes: int,
        token_text: Callable[[int], str],
    ) -> TokenStep:
        chosen = self.token_id
        shown = self.top_ids if chosen in self.top_ids else [*self.top_ids, chosen]
        index = torch.tensor(shown, device=self.raw_logits.device)
        # stages: [n_processors + 1, shown] logits of the shown tokens before/after each processor
        stages = torch.stack([self.raw_logits[0, index]] + [values_at(s, index) for _, s in self.stage_logits])
        raw_logprobs = self.raw_logprobs[0, index]
        processed = self.processed_probs[0, index]
        raw_rank = int((self.raw_logits[0] > self.raw_logits[0, chosen]).sum().item()) + 1
        whole = self.raw_top.whole if self.raw_top is not None else None
        # −Σ p ln p, 0 ln 0 = 0 (the recording took it already when it ran)
        nats = whole.entropy if whole is not None else float(torch.special.entr(self.raw_probs()).sum().item())
        entropy = nats / LN2
        varentropy = raw_varentropy(self.raw_probs()[0], self.raw_logprobs[0], entropy)
        kept_probs = self.kept_probs if self.kept_probs is not None else self.processed_probs
        processed_entropy = float(torch.special.entr(kept_probs).sum().item()) / LN2

        stage_values = stages.tolist()
        logprob_values = raw_logprobs.tolist()
        processed_values = processed.tolist()
        effects, cut_by = _processor_effects([name for name, _ in self.stage_logits], stage_values, shown)
        candidates = tuple(
            Candidate(token_id=tid, text=token_text(tid), raw_prob=math.exp(lp), processed_prob=pp,
                      raw_rank=(i + 1) if i < len(self.top_ids) else raw_rank, cut_by=cut_by.get(tid))
            for i, (tid, lp, pp) in enumerate(zip(shown, logprob_values, processed_values, strict=True))
        )
        chosen_i = shown.index(chosen)
        return TokenStep(
            step=step, token_id=chosen, text=text, prob=processed_values[chosen_i],
            raw_prob=math.exp(logprob_values[chosen_i]), logprob=logprob_values[chosen_i], raw_rank=raw_rank,
            entropy=entropy, processed_entropy=processed_entropy, candidates=candidates,
            shown_raw_mass=sum(math.exp(lp) for lp in logprob_values[: len(self.top_ids)]),
            effects=effects, forced=forced, step_ms=step_ms, kv_cache_bytes=kv_bytes, mirostat_mu=self.mirostat_mu,
            raw_top=self.raw_top,
            grammar=self.grammar, varentropy=varentropy,
        )


def raw_varentropy(probs: torch.Tensor, logprobs: torch.Tensor, entropy_bits: float) -> float:
    """Σ p (log2 p + H)², in bits² (entropix's varentropy): how much the surprisal varies ([vocab] each)."""
    surprise = torch.where(probs > 0, logprobs / LN2 + entropy_bits, 0.0)
    return float((probs * surprise * surprise).sum().item())


def analyse_step(
    pipeline: tuple[NamedTransform, ...], ids: torch.Tensor, logits: torch.Tensor, num_candidates: int, *,
    compact: bool = True, record: int = 0,
) -> StepAnalysis:
    """Run ``pipeline`` over ``logits`` ([1, vocab]) keeping every stage, and pick the raw top candidates.

    ``compact``: the stages after the first cut run on the tokens still in play (``samplers.chain``: exact);
    False runs every stage on the whole vocabulary (the reference the tests compare with). ``record``: how many of
    the likeliest raw tokens to pack into the step for the what-if (``RunSettings.record_candidates``)."""
    stage_logits = run_chain(pipeline, ids, logits, compact=compact)
    last = stage_logits[-1][1] if stage_logits else logits
    raw_logprobs = logits.log_softmax(dim=-1)
    vocab = logits.shape[-1]
    top = torch.topk(logits[0], min(max(num_candidates, record), vocab))  # by raw rank
    top_ids = top.indices[:num_candidates].tolist()
    raw_probs = raw_logprobs.exp() if record > 0 else None  # shared with the entropy (one exp pass a step)
    raw_top = (pack_raw_candidates(top.indices[:record], raw_logprobs[0], logits[0], raw_probs[0])
               if raw_probs is not None else None)
    if isinstance(last, CompactLogits):
        kept_probs = last.probs()
        processed_probs = torch.zeros_like(logits).index_copy_(1, last.kept.ids, kept_probs)
        return StepAnalysis(raw_logits=logits, raw_logprobs=raw_logprobs, stage_logits=stage_logits,
                            processed_logits=last.full(), processed_probs=processed_probs, top_ids=top_ids,
                            kept=last.kept, kept_probs=kept_probs, raw_top=raw_top,
                            known_raw_probs=raw_probs)
    return StepAnalysis(raw_logits=logits, raw_logprobs=raw_logprobs, stage_logits=stage_logits,
                        processed_logits=last, processed_probs=last.softmax(dim=-1), top_ids=top_ids,
                        raw_top=raw_top, known_raw_probs=raw_probs)


LOGPROB_STEP = 1024  # the packed log-probabilities' resolution: 1/1024 nat


def pack_raw_candidates(top_ids: torch.Tensor, raw_logprobs: torch.Tensor, raw_logits: torch.Tensor,
                        raw_probs: torch.Tensor | None = None) -> RawCandidates:
    """``top_ids`` ([n], by raw rank) with their raw log-probabilities ([vocab]; ``raw_probs`` their exp) packed
    as ``RawCandidates`` says."""
    vocab = raw_logprobs.shape[0]
    logprobs = raw_logprobs[top_ids].double()
    tail = max(0.0, 1.0 - float(logprobs.exp().sum()))
    id_bytes = 2 if vocab <= 2**16 else 4
    ids = top_ids.cpu().numpy().astype(f"<u{id_bytes}")
    quantised = (-logprobs * LOGPROB_STEP).round().clamp(0, 2**16 - 1).cpu().numpy().astype("<u2")
    first = top_ids[:1]  # logit − log-probability is the log-sum-exp (the softmax already took it: no new pass)
    lse = float((raw_logits[first].double() - raw_logprobs[first].double()).sum())
    # The tail's log-moments Σ p^a, on the tail itself (no difference of two near sums), from one exp pass.
    probs = raw_probs if raw_probs is not None else raw_logprobs.exp()
    rest = probs.index_fill(0, top_ids, 0.0)  # [vocab]
    root = rest.sqrt()
    sums = torch.stack([root.sum(), (rest * root).sum(), (rest * rest).sum()]).double()  # a = 0.5, 1.5, 2
    assert TAIL_POWERS == (0.5, 1.5, 2.0)
    moments = tuple(round(v, 6) if v > -math.inf else v for v in sums.log().tolist())
    return RawCandidates(ids=base64.b64encode(ids.tobytes()).decode("ascii"),
                         logprobs=base64.b64encode(quantised.tobytes()).decode("ascii"), logsumexp=lse,
                         tail_mass=tail, vocab_size=vocab, id_bytes=id_bytes, tail_log_moments=moments,
                         whole=whole_vocabulary(raw_logits, probs))


def whole_vocabulary(raw_logits: torch.Tensor, raw_probs: torch.Tensor) -> WholeVocabulary:
    """The whole raw distribution's entropy (nats) and its finite logits' mean, population standard deviation and
    count ([vocab] each; as top-nσ and dynamic temperature compute them), in one small transfer."""
    finite = torch.isfinite(raw_logits)
    count = finite.sum().clamp(min=1)
    zeroed = torch.where(finite, raw_logits, 0.0).double()
    mean = zeroed.sum() / count
    spread = torch.where(finite, (zeroed - mean) ** 2, 0.0).sum() / count
    entropy = torch.special.entr(raw_probs).sum().double()
    values = torch.stack([entropy, mean, spread.sqrt(), count.double()]).tolist()
    return WholeVocabulary(entropy=values[0], logit_mean=values[1], logit_std=values[2], finite=int(values[3]))


def _processor_effects(
    names: list[str], stage_values: list[list[float]], shown: list[int]
) -> tuple[tuple[ProcessorEffect, ...], dict[int, str]]:
    effects = []
    cut_by: dict[int, str] = {}
    for s, name in enumerate(names, start=1):
        before, after = stage_values[s - 1], stage_values[s]
        removed, reweighted = [], []
        for tid, b, a in zip(shown, before, after, strict=True):
            if math.isfinite(b) and not math.isfinite(a):
                removed.append(tid)
                cut_by.setdefault(tid, name)
            elif math.isfinite(a) and a != b:
                reweighted.append(tid)
        effects.append(ProcessorEffect(name=name, removed=tuple(removed), reweighted=tuple(reweighted)))
    return tuple(effects), cut_by
