"""The constraint as a sampler: llguidance's ``LLMatcher`` on the model's own tokenizer masks every token the
grammar forbids (its logit becomes ``-inf``); ``accept`` advances the matcher by the chosen token.

- The mask comes from ``compute_bitmask`` (one bit per token); tokens past the tokenizer's vocabulary (a model's
  padded rows) are forbidden. The model's end tokens are allowed exactly where the grammar accepts (llguidance's
  EOS bit, extended to every id the model ends on).
- ``finished()``: the run ends after the last accepted token, with its reason: "grammar" once the matcher has
  stopped (nothing can follow), "grammar_blocked" when a taken token was one it forbids (forced or chosen by
  hand). ``incomplete()``: why stopping now would leave the output unfinished.
- ``snapshot``/``restore`` keep a ``deep_copy`` of the matcher (tens of microseconds): the rollback counts of
  ``LLMatcher.rollback`` do not count an end token taken after the grammar stopped, a copy needs no count.
- ``last``: what the latest ``apply`` allowed (the mask, [vocab] bool, and the fast-forward tokens the grammar
  fixes from there), for the step's record (``grammar_step``).
- ``forced_run``: the fast-forward tokens that leave no choice, for a strategy that feeds them to the model in one
  pass (``playground.engine.fast_forward``).

ids: [batch, seq]; logits: [batch, vocab].
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from playground.config.errors import ConfigError
from playground.config.samplers.grammar import GrammarSettings, check_constraint
from playground.engine.samplers.base import BuildContext, Sampler, engine_sampler
from playground.events import StopReason
from playground.events.grammar import GrammarStep

NEG_INF = float("-inf")

# llguidance's tokenizer for a Hugging Face tokenizer takes ~2 s to build (it walks the vocabulary): one per
# (tokenizer, vocabulary size, end tokens), kept while the tokenizer lives.
_TOKENIZERS: dict[tuple[int, int, tuple[int, ...]], tuple[Any, Any]] = {}
_LOCK = threading.Lock()


def ll_tokenizer(tokenizer: Any, vocab_size: int, eos_ids: tuple[int, ...]) -> Any:
    """llguidance's ``LLTokenizer`` for ``tokenizer`` (a fast Hugging Face tokenizer), cached."""
    import llguidance.hf

    key = (id(tokenizer), vocab_size, eos_ids)
    with _LOCK:
        hit = _TOKENIZERS.get(key)
        if hit is not None and hit[0] is tokenizer:
            return hit[1]
        try:
            made = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size, eos_token=list(eos_ids) or None)
        except Exception as error:  # "Only fast tokenizers are supported", "vocab size too small; 64 vs 320"
            raise ConfigError(f"a constraint needs the model's fast (Rust) tokenizer, as wide as its vocabulary: "
                              f"{error}") from None
        _TOKENIZERS[key] = (tokenizer, made)
        return made


@dataclass(frozen=True)
class Allowed:
    """What one ``apply`` allowed: ``mask`` [vocab] bool (True = allowed), and the tokens the grammar fixes from
    this state without a choice (llguidance's fast-forward tokens; empty when there is a choice)."""

    mask: torch.Tensor
    ff_tokens: tuple[int, ...]


def unpack_bitmask(bitmask: bytes, vocab: int) -> torch.Tensor:
    """llguidance's bitmask (bit ``i % 32`` of 32-bit word ``i // 32`` is token ``i``) -> [vocab] bool."""
    bits = np.unpackbits(np.frombuffer(bitmask, dtype=np.uint8), bitorder="little")
    out = np.zeros(vocab, dtype=bool)
    n = min(vocab, bits.shape[0])
    out[:n] = bits[:n]
    return torch.from_numpy(out)


@engine_sampler
class Grammar(Sampler):
    declares = "grammar"
    name = "grammar"

    def __init__(self, matcher: Any, vocab: int, eos_ids: tuple[int, ...], kind: str) -> None:
        self.matcher = matcher
        self.vocab = vocab
        self.eos_ids = tuple(i for i in eos_ids if 0 <= i < vocab)
        self.kind = kind
        self.last: Allowed | None = None
        self.broken = ""  # why a taken token broke the matcher ("" while it follows)
        self._moved: dict[torch.device, torch.Tensor] = {}  # the mask on a model's device, this state's

    @classmethod
    def build(cls, settings: Any, context: BuildContext) -> Sampler:
        import llguidance

        g = settings.group(GrammarSettings)
        if context.tokenizer is None:
            raise ConfigError(f"a constraint needs the model's tokenizer, which the {context.strategy} strategy "
                              "does not give its samplers")
        vocab = context.vocab_size if context.vocab_size is not None else len(context.tokenizer)
        eos_ids = tuple(context.eos_ids) or tuple(
            i for i in (getattr(context.tokenizer, "eos_token_id", None),) if isinstance(i, int))
        tokenizer = ll_tokenizer(context.tokenizer, vocab, eos_ids)
        grammar = check_constraint(g, tokenizer)
        matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise ConfigError(f"--{g.given()[0].replace('_', '-')}: {matcher.get_error().strip()}")
        return cls(matcher, vocab, eos_ids, g.given()[0])

    # -- the mask -------------------------------------------------------------------------------------------------

    def allowed(self) -> Allowed:
        """The tokens the grammar allows now (computed once per matcher state)."""
        if self.last is None:
            mask = self._mask_of(self.matcher)
            ff = tuple(self.matcher.compute_ff_tokens()) if not self.matcher.is_stopped() else ()
            self.last = Allowed(mask, ff)
        return self.last

    def forced_run(self, limit: int) -> tuple[int, ...]:
        """The tokens the grammar fixes from this state, one after another, as long as each is the only token its
        state allows (at most ``limit``): llguidance's fast-forward tokens, kept only where the mask leaves no other
        token (a longer token over the forced bytes and beyond, or an end token where the grammar accepts, would
        be a choice), so a run that takes them emits exactly the tokens it would take step by step. The matcher
        itself does not move (a copy walks the run)."""
        allowed = self.allowed()
        if self.broken or limit <= 0 or not allowed.ff_tokens:
            return ()
        out: list[int] = []
        matcher = None
        mask, ff = allowed.mask, allowed.ff_tokens
        while len(out) < limit:
            token = ff[0] if ff else -1
            if not 0 <= token < mask.shape[0] or token in self.eos_ids or int(mask.sum().item()) != 1 or not bool(
                    mask[token]):
                break
            out.append(token)
            matcher = matcher if matcher is not None else self.matcher.deep_copy()
            if not matcher.consume_token(token) or matcher.is_stopped():
                break
            mask, ff = self._mask_of(matcher), tuple(matcher.compute_ff_tokens())
        return tuple(out)

    def _mask_of(self, matcher: Any) -> torch.Tensor:
        """``matcher``'s mask, [vocab] bool, every end token allowed where the grammar accepts."""
        mask = unpack_bitmask(matcher.compute_bitmask(), self.vocab)
        if self.eos_ids and bool(mask[list(self.eos_ids)].any()):
            mask[list(self.eos_ids)] = True  # the grammar accepts: every end token the model has may end it
        return mask

    def _moved_on(self) -> None:
        """The matcher moved (or went back): the next ``apply`` asks it again."""
        self.last = None
        self._moved = {}

    def _mask_on(self, device: torch.device) -> torch.Tensor:
        """The mask on ``device`` (moved once per matcher state)."""
        self.allowed()
        mask = self._moved.get(device)
        if mask is None:
            mask = self._moved[device] = self.allowed().mask.to(device)
        return mask

    def apply(self, ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        mask = self._mask_on(logits.device)
        width = logits.shape[-1]
        if width != mask.shape[0]:  # a model whose logits are wider or narrower than its configured vocabulary
            mask = torch.cat([mask, mask.new_zeros(max(0, width - mask.shape[0]))])[:width]
        return logits.masked_fill(~mask, NEG_INF)

    # -- following the run ----------------------------------------------------------------------------------------

    def accept(self, token_id: int, prob: float) -> None:
        if self.broken or token_id < 0:
            return
        if self.matcher.is_stopped() and token_id in self.eos_ids:
            return  # the end after a finished grammar: nothing to consume
        allowed = self.allowed().mask
        if not (0 <= token_id < allowed.shape[0]) or not bool(allowed[token_id]):
            self.broken = f"token {token_id} is not one the {self.kind.replace('_', ' ')} allows here"
        elif token_id in self.eos_ids and self.matcher.is_accepting():
            pass  # the end token where the grammar accepts: the run ends on it (the loop's "eos")
        elif not self.matcher.consume_token(token_id):
            self.broken = self.matcher.get_error().strip().splitlines()[0] if self.matcher.get_error() else (
                f"the matcher refused token {token_id}")
        self._moved_on()

    def finished(self) -> tuple[StopReason, str] | None:
        """(stop reason, note) when the run must end after the token just accepted, else None."""
        if self.broken:
            return "grammar_blocked", f"the constraint cannot follow: {self.broken}"
        if self.matcher.is_stopped():
            return "grammar", f"the {self.kind.replace('_', ' ')} is complete: nothing more can follow"
        return None

    def incomplete(self) -> str:
        """Why the output would be unfinished if the run ended now ("" when the grammar accepts it)."""
        if self.broken or self.matcher.is_accepting() or self.matcher.is_stopped():
            return ""
        return f"the budget ended before the {self.kind.replace('_', ' ')} was complete"

    def step_record(self, raw_probs: torch.Tensor, raw_top: int, shown: Sequence[int] | None = None) -> GrammarStep:
        """What the mask did at this step (``apply`` ran on its state), against the raw distribution ``raw_probs``
        ([1, vocab] or [vocab]) and the raw top token ``raw_top``; ``shown``: the step's raw top candidates, of
        which the record names those the mask forbids (None: not recorded)."""
        allowed = self.allowed()
        mask = self._mask_on(raw_probs.device)
        probs = raw_probs.reshape(-1)
        width = probs.shape[0]
        if width != mask.shape[0]:
            mask = torch.cat([mask, mask.new_zeros(max(0, width - mask.shape[0]))])[:width]
        removed, kept = (float(v) for v in torch.stack([probs.masked_fill(mask, 0.0).double().sum(),
                                                          probs.masked_fill(~mask, 0.0).double().sum()]).tolist())
        forbidden = None
        if shown is not None:
            host = allowed.mask  # [vocab] on the CPU: a handful of lookups, no device sync per token
            forbidden = tuple(int(t) for t in shown if not (0 <= t < host.shape[0] and bool(host[t])))
        return GrammarStep(allowed=int(mask.sum().item()), removed_mass=removed,
                           top_forbidden=not bool(mask[raw_top]), ff_tokens=allowed.ff_tokens, forbidden=forbidden,
                           allowed_mass=kept)

    def reset(self) -> None:
        self.matcher.reset()
        self.broken = ""
        self._moved_on()

    def snapshot(self) -> tuple[Any, str]:
        return self.matcher.deep_copy(), self.broken

    def restore(self, state: tuple[Any, str]) -> None:
        matcher, self.broken = state
        self.matcher = matcher.deep_copy()
        self._moved_on()

    def followed_by(self, token_id: int) -> Grammar:
        """A copy of this constraint after ``token_id`` (a speculative draft's node): the mask this state computed is
        shared with the copy, not recomputed, before it consumes the token (``broken`` when it is one it forbids)."""
        twin = Grammar(self.matcher.deep_copy(), self.vocab, self.eos_ids, self.kind)
        twin.broken, twin.last = self.broken, self.allowed()
        twin.accept(token_id, 0.0)
        return twin

    def clone(self) -> Sampler:
        twin = Grammar(self.matcher.deep_copy(), self.vocab, self.eos_ids, self.kind)
        twin.broken = self.broken
        return twin
