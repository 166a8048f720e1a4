"""SynthID-Text (Dathathri et al. 2024) as transformers' ``SynthIDTextWatermarkLogitsProcessor`` computes it: the
g-values hash the last ``ngram_len − 1`` tokens, the candidate and each key (its linear-congruential hash, int64)
into a random 0/1 table; the tournament reweights the probabilities layer by layer, ``p ← p · (1 + g − Σ p g)``;
a context seen among the last ``context_history_size`` is left alone.

transformers keeps its context in a state that starts at zeros and takes each generated token in turn (the prompt
never enters it); here the same context is read off the ids (the generated tokens, padded with zeros), so a step
asked twice (a rollback, step mode) gets the same answer. The g-values are computed only for the tokens still in play
(a token of probability 0 keeps it whatever its g); removed tokens stay ``-inf`` where transformers writes
``finfo.min`` (both are probability 0), and so does a token whose tournament factor rounded below zero in float
(its log is NaN; transformers writes ``finfo.min`` there too). The table is drawn on the CPU (transformers draws
it on the model's device).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MULTIPLIER = 6364136223846793005
INCREMENT = 1


def _wrap64(x: int) -> int:
    return ((x + 2**63) % 2**64) - 2**63


# A candidate's hash at a layer, ((h + t)·M + 1 + k)·M + 1, is (h·M² + M + k·M + 1) + t·M² in int64's wrapping
# arithmetic: one term per step and layer, one per token, and a single [tokens, layers] addition.
MULTIPLIER_SQUARED = _wrap64(MULTIPLIER * MULTIPLIER)


def accumulate_hash(current: torch.Tensor, data: torch.Tensor) -> torch.Tensor:
    """transformers' hash: for each entry of ``data``'s last axis, ``h = (h + d) · M + 1`` (int64, wrapping)."""
    for i in range(data.shape[-1]):
        current = (current + data[..., i]) * MULTIPLIER + INCREMENT
    return current


@dataclass(frozen=True)
class SynthIDKey:
    keys: tuple[int, ...]
    ngram_len: int = 5
    sampling_table_size: int = 2**16
    sampling_table_seed: int = 0
    context_history_size: int = 1024
    skip_first_ngram_calls: bool = False

    @property
    def depth(self) -> int:
        return len(self.keys)


class SynthID:
    """One key's g-values and tournament (``start``: where the generated tokens begin in the ids)."""

    def __init__(self, key: SynthIDKey) -> None:
        self.key = key
        generator = torch.Generator().manual_seed(key.sampling_table_seed)
        self.table = torch.randint(0, 2, (key.sampling_table_size,), generator=generator)
        self.keys = torch.tensor(key.keys, dtype=torch.long)
        self._on: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
        self._float_tables: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}

    def _tensors(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        held = self._on.get(device)
        if held is None:
            held = self._on[device] = (self.table.to(device), self.keys.to(device))
        return held

    def layer_g(self, context_hash: torch.Tensor, tokens: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The g-values [depth, n] as ``dtype`` (the tournament's): for a table of 2^b entries only the hash's low b
        bits matter, and they add in int32 (half the work of the int64 hash)."""
        table, keys = self._tensors(tokens.device)
        size = table.shape[0]
        if size & (size - 1):
            return self.g_values_after(context_hash, tokens).T.to(dtype)
        mask = size - 1
        per_layer = context_hash * MULTIPLIER_SQUARED + (keys * MULTIPLIER + (MULTIPLIER + INCREMENT))
        low_layers = (per_layer & mask).to(torch.int32)  # [depth]
        low_tokens = ((tokens * MULTIPLIER_SQUARED) & mask).to(torch.int32)  # [n]
        values = self._float_tables.get((tokens.device, dtype))
        if values is None:
            values = self._float_tables[(tokens.device, dtype)] = table.to(dtype)
        return values[(low_layers[:, None] + low_tokens[None, :]) & mask]

    def context_hash(self, context: torch.Tensor) -> torch.Tensor:
        """[..., ngram_len − 1] contexts -> [...] their hashes."""
        return accumulate_hash(torch.ones(context.shape[:-1], dtype=torch.long, device=context.device), context)

    def g_values_after(self, context_hash: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """The g-values [n, depth] of the candidates ``tokens`` [n] after a context of hash ``context_hash`` []
        (transformers' hash, regrouped: see ``MULTIPLIER_SQUARED``)."""
        table, keys = self._tensors(tokens.device)
        per_layer = context_hash * MULTIPLIER_SQUARED + (keys * MULTIPLIER + (MULTIPLIER + INCREMENT))  # [depth]
        h = (tokens * MULTIPLIER_SQUARED)[:, None] + per_layer[None, :]  # [n, depth]
        size = table.shape[0]
        index = h & (size - 1) if size & (size - 1) == 0 else h % size  # a power of two: the floor mod is a mask
        return table[index]

    def g_values(self, ids: torch.Tensor) -> torch.Tensor:
        """transformers' ``compute_g_values`` on ``ids`` [batch, n]: [batch, n − (ngram_len − 1), depth]."""
        ngrams = ids.unfold(1, self.key.ngram_len, 1)  # [batch, m, ngram_len]
        hashes = self.context_hash(ngrams[..., :-1])
        table, keys = self._tensors(ids.device)
        h = (hashes + ngrams[..., -1]) * MULTIPLIER + INCREMENT
        h = (h[..., None] + keys) * MULTIPLIER + INCREMENT
        return table[h % table.shape[0]]

    def repetition_mask(self, ids: torch.Tensor) -> torch.Tensor:
        """transformers' ``compute_context_repetition_mask`` on ``ids`` [1, n]: True where the n-gram's context was
        not among the last ``context_history_size`` (the history starts filled with zeros, as there)."""
        contexts = ids[:, :-1].unfold(1, self.key.ngram_len - 1, 1)  # [1, m, ngram_len − 1]
        hashes = self.context_hash(contexts)[0].tolist()
        size = self.key.context_history_size
        history = [0] * size
        fresh = []
        for h in hashes:
            fresh.append(h not in history)
            history = [h, *history[:-1]]
        return torch.tensor([fresh], dtype=torch.bool)

    def generation_contexts(self, ids: torch.Tensor, start: int) -> torch.Tensor:
        """The context of each generated step so far and of the next: [steps + 1, ngram_len − 1] (the generated
        tokens after ``ngram_len − 1`` zeros, as transformers' state holds them)."""
        width = self.key.ngram_len - 1
        generated = ids[0, start:]
        padded = torch.cat([torch.zeros(width, dtype=torch.long, device=ids.device), generated])
        return padded.unfold(0, width, 1) if width > 0 else padded.new_zeros((generated.shape[0] + 1, 0))

    def apply(self, ids: torch.Tensor, logits: torch.Tensor, start: int) -> tuple[torch.Tensor, bool]:
        """The watermarked logits for the next token of ``ids`` [1, seq] (generated from ``start``) and whether
        the tournament acted (False: a skipped first call or a repeated context)."""
        step = ids.shape[1] - start
        key = self.key
        if key.skip_first_ngram_calls and step + 1 < key.ngram_len:
            return logits, False
        contexts = self.generation_contexts(ids, start)  # [step + 1, width]
        hashes = self.context_hash(contexts)  # [step + 1]
        first = (key.ngram_len - 1) if key.skip_first_ngram_calls else 0  # the calls that entered the history
        earlier = hashes[first:step].flip(0)[: key.context_history_size]  # the history, newest first
        current = hashes[step]
        repeated = bool((earlier == current).any()) or (earlier.shape[0] < key.context_history_size
                                                         and int(current) == 0)
        if repeated:
            return logits, False
        return self.tournament(logits, current), True

    def tournament(self, logits: torch.Tensor, context_hash: torch.Tensor) -> torch.Tensor:
        """transformers' ``update_scores`` on the tokens still in play of ``logits`` [1, vocab]."""
        row = logits[0]
        kept = torch.isfinite(row).nonzero().squeeze(1)
        g = self.layer_g(context_hash, kept, row.dtype)  # [depth, K]
        probs = row[kept].softmax(dim=-1)
        for g_layer in g:
            probs = probs * (1 + g_layer - (g_layer * probs).sum())
        out = torch.full_like(logits, float("-inf"))
        log_probs = probs.log()  # a g = 0 factor that rounded below zero gives NaN: probability 0, as transformers
        out[0, kept] = torch.where(torch.isfinite(log_probs), log_probs, float("-inf"))  # writes finfo.min there
        return out
