"""Figures measured on one output, for comparing panes: repetition, diversity, agreement, likelihood."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from playground.models.loaded import LoadedModel


def ngrams(ids: Sequence[int], n: int) -> list[tuple[int, ...]]:
    return [tuple(ids[i : i + n]) for i in range(len(ids) - n + 1)]


def distinct_n(ids: Sequence[int], n: int) -> float:
    """Unique n-grams / all n-grams of the output (1.0 when it never repeats one; 0.0 for an output too short)."""
    grams = ngrams(ids, n)
    return len(set(grams)) / len(grams) if grams else 0.0


def repeated_ngrams(ids: Sequence[int], n: int = 3) -> int:
    """How many n-grams of the output repeat an earlier one (a loop of length L repeats about L of them)."""
    grams = ngrams(ids, n)
    return len(grams) - len(set(grams))


def first_divergence(ids: Sequence[int], reference: Sequence[int]) -> int:
    """The first position where ``ids`` differs from ``reference`` (one ending early counts); -1 if identical."""
    for i, (a, b) in enumerate(zip(ids, reference, strict=False)):
        if a != b:
            return i
    return -1 if len(ids) == len(reference) else min(len(ids), len(reference))


@torch.inference_mode()
def log_likelihood(lm: LoadedModel, prompt_ids: Sequence[int], ids: Sequence[int]) -> float:
    """Sum of log p(token | everything before it) over ``ids`` after ``prompt_ids``, under ``lm``, in nats."""
    if not ids:
        return 0.0
    full = torch.tensor([[*prompt_ids, *ids]], device=lm.device)
    logits = lm.model(full).logits[0, len(prompt_ids) - 1 : -1].float()  # [len(ids), vocab]: predicts ids
    logprobs = torch.log_softmax(logits, dim=-1)
    return float(logprobs.gather(1, torch.tensor(ids, device=lm.device)[:, None]).sum())


def output_figures(ids: Sequence[int], reference_ids: Sequence[int], decode_ms: float) -> dict[str, float]:
    return {"tokens": float(len(ids)), "repeated_3grams": float(repeated_ngrams(ids, 3)),
            "distinct_1": distinct_n(ids, 1), "distinct_2": distinct_n(ids, 2),
            "first_divergence": float(first_divergence(ids, reference_ids)), "decode_ms": decode_ms}
