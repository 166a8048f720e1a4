"""How far a quantized model is from its reference, under teacher forcing on one token sequence.

``perplexity``: exp of the mean next-token NLL. ``kl_stats``: per-token KL(reference || quantized) of the
next-token distributions, summarised as llama.cpp's ``llama-perplexity --kl-divergence`` reports it (mean,
median, p99, max) with the top-1 agreement. ``first_divergence``: where two greedy continuations first differ.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F


def _ids_tensor(model: Any, ids) -> torch.Tensor:
    device = next(model.parameters()).device
    return torch.as_tensor(list(ids) if not torch.is_tensor(ids) else ids, device=device).reshape(1, -1)


def sequence_logits(model: Any, ids) -> torch.Tensor:
    """Logits [positions, vocab] (float32, CPU) of one teacher-forced pass over ``ids``."""
    with torch.inference_mode():
        out = model(input_ids=_ids_tensor(model, ids), use_cache=False)
    return out.logits[0].float().cpu()


def _logits(model_or_logits: Any, ids) -> torch.Tensor:
    """A model's logits over ``ids``, or the given logits [positions, vocab] when already computed."""
    if torch.is_tensor(model_or_logits):
        return model_or_logits.float().cpu()
    return sequence_logits(model_or_logits, ids)


def perplexity(model: Any, ids) -> float:
    """exp(mean NLL) of tokens 1..n-1 given their prefixes (the first token is context only); ``model`` may be
    logits [n, vocab] already computed on ``ids``."""
    ids_list = list(ids.tolist() if torch.is_tensor(ids) else ids)
    if len(ids_list) < 2:
        raise ValueError("perplexity needs at least two tokens")
    logits = _logits(model, ids_list)[:-1]  # [n-1, vocab]: position t predicts token t+1
    targets = torch.tensor(ids_list[1:])
    nll = F.cross_entropy(logits.double(), targets, reduction="mean")
    return float(torch.exp(nll))


def kl_rows(p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    """KL(P ‖ Q) in nats between the softmaxes of each row of two logit matrices [rows, vocab] → [rows]."""
    log_p = F.log_softmax(p_logits, dim=-1)
    log_q = F.log_softmax(q_logits, dim=-1)
    return (log_p.exp() * (log_p - log_q)).sum(dim=-1).clamp_min(0.0)  # tiny negatives are rounding


def kl_stats(reference: Any, quantized: Any, ids) -> dict[str, float]:
    """Per-token KL(P_reference || P_quantized) over the n-1 positions that predict a next token.

    ``reference`` and ``quantized`` are models, or logits [n, vocab] already computed on ``ids``. Returns
    mean, median, p99, max (nats) and top1_agreement (share of positions whose argmax tokens agree)."""
    ids_list = list(ids.tolist() if torch.is_tensor(ids) else ids)
    ref = _logits(reference, ids_list)[: len(ids_list) - 1].double()
    quant = _logits(quantized, ids_list)[: len(ids_list) - 1].double()
    kl = kl_rows(ref, quant)  # [n-1]
    agree = (ref.argmax(dim=-1) == quant.argmax(dim=-1)).double().mean()
    return {
        "mean": float(kl.mean()),
        "median": float(kl.median()),
        "p99": float(torch.quantile(kl, 0.99)),
        "max": float(kl.max()),
        "top1_agreement": float(agree),
        "tokens": len(kl),
    }


def greedy_tokens(model: Any, prompt_ids, n: int) -> list[int]:
    """``n`` greedy tokens after ``prompt_ids`` (no stop at EOS), with a KV cache."""
    from transformers import DynamicCache

    ids = _ids_tensor(model, prompt_ids)
    cache = DynamicCache(config=model.config)
    out_tokens: list[int] = []
    with torch.inference_mode():
        step_input = ids
        for _ in range(n):
            out = model(input_ids=step_input, cache=cache, use_cache=True)
            token = int(out.logits[0, -1].argmax())
            out_tokens.append(token)
            step_input = torch.tensor([[token]], device=ids.device)
    return out_tokens


def first_divergence(reference: Any, quantized: Any, prompt_ids, n: int) -> int:
    """Index (0-based, among the ``n`` new tokens) of the first greedy token that differs; -1 if none does."""
    a = greedy_tokens(reference, prompt_ids, n)
    b = greedy_tokens(quantized, prompt_ids, n)
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), -1)
